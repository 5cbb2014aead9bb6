"""Data-parallel training: the update split across two gloo processes equals one process's, and a
``torchrun`` run writes one run dir, one metrics line per step and one checkpoint, and resumes."""

import copy
import dataclasses
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from trl.trainer import utils as trl_utils

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.config.validate import _check_processes
from marl_cli.core.samples import Sample
from marl_cli.core.world import World, init_from_launcher
from marl_cli.losses.epo import EPOConfig
from marl_cli.policies.regime import build_policies
from marl_cli.training.learner import sharding as sharding_module
from marl_cli.training.learner.policy_trainer import PolicyTrainer, loss_weight, mini_batches
from tests.helpers import FAST, free_port, torchrun, train_config
from tests.policies.test_tiny import SMALL
from tests.precision import Float64LogProbs, after_adam, rounding, to_float64

LOSS_TYPES = ("bnpo", "grpo", "dr_grpo", "dapo")
RUNS = [*((t, "none") for t in LOSS_TYPES), ("bnpo", "fsdp2"), ("grpo", "fsdp2")]
TERMS = 20_000
"""An upper bound on the terms any gradient entry or statistic here accumulates (≤ 16 rows × ≤ 37 positions ×
widths ≤ 3 layers' 64)."""
WEIGHTS_ATOL = after_adam(1e-3, 8, TERMS)
"""Two processes average their halves' gradients (another float order); weights compared in float64 after at
most 8 Adam steps at lr 1e-3 (2 RL steps × ≤ 4 mini-batches): ``after_adam``, 3.5e-6, against ~1e-3 that one
row's gradient moves a weight."""
STATS_RTOL = rounding(TERMS)
"""Loss, gradient norm, entropy: float64 rounding of ``TERMS`` terms (4.4e-12 relative)."""


def _rows(step: int) -> list[Sample]:
    gen = random.Random(step)
    return [Sample(task=i // 2, branch=i % 2, turn=0, role="agent", policy="shared",
                   prompt_ids=[gen.randrange(3, 60) for _ in range(gen.randint(2, 6))],
                   completion_ids=[gen.randrange(3, 60) for _ in range(gen.randint(1, 7))],
                   reward=0.0, advantage=0.0 if i < 4 or i == 5 else gen.uniform(-1, 1), sampling_logprobs=[])
            for i in range(10)]  # mini-batches of 4: the first all zero advantages, the second one (skipped rows)


def _grouped_rows(step: int) -> list[Sample]:
    """Mini-batches of 4 rows whose 1st and 3rd share a prompt (20–30 tokens) and the others not: in two
    processes rank 0's rows share their prompt and rank 1's do not; one process shares it too."""
    gen = random.Random(step)

    def prompt() -> list[int]:
        return [gen.randrange(3, 60) for _ in range(gen.randint(20, 30))]

    rows = []
    for task in range(4):
        shared = prompt()
        rows += [Sample(task=task, branch=b, turn=0, role="agent", policy="shared",
                        prompt_ids=shared if b % 2 == 0 else prompt(),
                        completion_ids=[gen.randrange(3, 60) for _ in range(gen.randint(1, 7))],
                        reward=0.0, advantage=gen.uniform(-1, 1), sampling_logprobs=[]) for b in range(4)]
    return rows


def _trainer(tmp: str, loss_type: str, world: World, sharding: str = "none",
             weights: dict[str, torch.Tensor] | None = None, dtype: str = "float32",
             layers: int = 1, checkpointing: bool = False, beta: float = 0.0, epo: dict[str, float] | None = None,
             **extra: Any) -> PolicyTrainer:
    tiny = dataclasses.replace(SMALL, num_hidden_layers=layers)
    model_cfg = OmegaConf.structured(ModelConfig(tiny=tiny, dtype=dtype))
    policy = build_policies({"agent": "shared"}, model_cfg, 0, Path(tmp), torch.device("cpu"),
                            master_weights=True)["shared"]
    if dtype == "float32":  # equality with one process is checked in float64 (tests/precision.py)
        to_float64(policy)
    if weights is not None:  # as a resume loads the checkpoint's weights before the trainer is built
        policy.model.load_state_dict(weights)
    cfg = OmegaConf.structured(TrainerConfig(learning_rate=1e-3, steps=4, mini_batch_size=4, loss_type=loss_type,
                                             log_ref_kl=True, sharding=sharding, gradient_checkpointing=checkpointing,
                                             beta=beta, **extra))
    loss = None if epo is None else OmegaConf.structured(EPOConfig(name="epo", **epo))
    return PolicyTrainer(policy, cfg, 0.7, 8, Path(tmp) / "trl", 0, world, loss)


def _weights(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}


def _train(tmp: str, loss_type: str, world: World, sharding: str = "none") -> tuple[dict[str, torch.Tensor],
                                                                                   list[dict[str, float]]]:
    trainer = _trainer(tmp, loss_type, world, sharding)
    if sharding == "fsdp2" and world.size > 1:  # each rank holds half of every block's weights
        local = sum(p.to_local().numel() for p in trainer.learner.model.layers.parameters())
        assert local * world.size == sum(p.numel() for p in trainer.model.model.layers.parameters())
    stats = [trainer.update(_rows(step), random.Random(step)) for step in range(2)]
    return _weights(trainer), stats


def _first_step(tmp: str, world: World) -> tuple[dict[str, torch.Tensor], dict]:
    """The weights and (rank 0's, as the checkpoint holds it) optimiser state after one fsdp2 bnpo step."""
    first = _trainer(tmp, "bnpo", world, "fsdp2")
    first.update(_rows(0), random.Random(0))
    return _weights(first), world.from_main(first.state_dict())


def _resumed(tmp: str, world: World, first: tuple[dict[str, torch.Tensor], dict]) -> dict[str, torch.Tensor]:
    """A trainer built on step 0's weights (as a resume builds it), loading step 0's optimiser state, then step 1."""
    weights, state = first
    second = _trainer(tmp, "bnpo", world, "fsdp2", weights)
    second.load_state_dict(copy.deepcopy(state))  # a load may keep views of the state: leave the caller's intact
    second.update(_rows(1), random.Random(1))
    return _weights(second)


def _bf16(tmp: str, world: World) -> tuple[dict[str, torch.Tensor], ...]:
    """One bnpo step in bf16 (fp32 masters): the masters a checkpoint holds and the policy's weights after it, and
    the policy's weights before it."""
    trainer = _trainer(tmp, "bnpo", world, "fsdp2" if world.size > 1 else "none", dtype="bfloat16")
    before = _weights(trainer)
    trainer.update(_rows(0), random.Random(0))
    masters = trainer.master_weights()
    return {k: v.clone() for k, v in (masters or trainer.learner.state_dict()).items()}, _weights(trainer), before


def _shared_prompts(tmp: str, world: World) -> dict[bool, tuple[dict[str, torch.Tensor], list[dict[str, float]], list]]:
    """Two steps on rows sharing prompts, with a 3-layer learner sharded if ``world`` has several processes, without
    and with gradient checkpointing: the weights, the stats, and which layers held gathered weights each time the
    backward gathered a layer again for its prompt pass."""
    return {checkpointing: _shared_prompt_steps(tmp, world, checkpointing) for checkpointing in (False, True)}


def _shared_prompt_steps(tmp: str, world: World,
                         checkpointing: bool) -> tuple[dict[str, torch.Tensor], list[dict[str, float]], list]:
    gathered: list[tuple[int, list[bool]]] = []
    backward = sharding_module._Regather.backward

    def spy(ctx: Any, keys: torch.Tensor, values: torch.Tensor) -> Any:
        out = backward(ctx, keys, values)
        layers = sharding_module.blocks(trainer.learner)
        gathered.append((layers.index(ctx.block),
                         [layer._get_fsdp_state()._fsdp_param_group.is_unsharded for layer in layers]))
        return out

    sharding_module._Regather.backward = staticmethod(spy)
    try:
        trainer = _trainer(f"{tmp}/{checkpointing}", "bnpo", world, "fsdp2" if world.size > 1 else "none", layers=3,
                           checkpointing=checkpointing)
        stats = [trainer.update(_grouped_rows(step), random.Random(step)) for step in range(2)]
    finally:
        sharding_module._Regather.backward = staticmethod(backward)
    return _weights(trainer), stats, gathered


def _every_run(tmp: str, world: World) -> dict:
    results: dict = {(t, s): _train(tmp, t, world, s) for t, s in RUNS}  # one run dir, as under torchrun
    results["first"] = _first_step(tmp, world)
    results["resumed"] = _resumed(tmp, world, results["first"])
    return results


def _worker(rank: int, port: int, work: Callable[[str, World], Any], tmp: str, out: str) -> None:
    """One of two gloo processes: ``work(tmp, world)``, rank 0's result saved to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), CUDA_VISIBLE_DEVICES="")
    torch.set_num_threads(1)
    init_from_launcher()
    result = work(tmp, World.current())
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()


def _in_two_processes(work: Callable[[str, World], Any], tmp_path: Path) -> Any:
    """Rank 0's result of ``work`` run by two gloo processes sharing the dir ``tmp_path``."""
    out = tmp_path / "two.pt"
    mp.spawn(_worker, args=(free_port(), work, str(tmp_path), str(out)), nprocs=2, join=True)
    return torch.load(out, weights_only=False)


@pytest.fixture
def float64_head(monkeypatch):
    """TRL's fused head in float64 in this process for the test (``to_float64`` sets it in the workers)."""
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbs)


def test_two_process_update_equals_one_process_update(tmp_path, float64_head):
    """Plain data parallelism for every loss type, FSDP2 sharding for two (and its optimiser state saved whole and
    loaded back by two processes and by one), against one process training the same rows."""
    two = _in_two_processes(_every_run, tmp_path)
    ones = {}
    for loss_type, sharding in RUNS:
        if loss_type not in ones:
            ones[loss_type] = _train(str(tmp_path / f"one-{loss_type}"), loss_type, World())
        weights, stats = ones[loss_type]
        weights2, stats2 = two[loss_type, sharding]
        for key, value in weights.items():
            torch.testing.assert_close(weights2[key], value, atol=WEIGHTS_ATOL, rtol=0,
                                       msg=f"{loss_type}, {sharding}: {key}")
        for one, two_step in zip(stats, stats2, strict=True):
            assert one["mini_batches"] == two_step["mini_batches"] == 3
            for key in ("loss", "grad_norm", "entropy", "advantage/mean", "clip_ratio/region_mean"):  # global
                assert two_step[key] == pytest.approx(one[key], rel=STATS_RTOL, abs=STATS_RTOL), \
                    (loss_type, sharding, key)
            # per-token diagnostics are the mean of each rank's masked mean (not token-weighted across ranks)
            assert two_step["kl_ref"] == pytest.approx(one["kl_ref"], rel=0.1)
    # the sharded optimiser state, saved whole, resumes in two processes and in one
    one_resumed = _resumed(str(tmp_path / "one-resumed"), World(), two["first"])
    for key, value in ones["bnpo"][0].items():
        torch.testing.assert_close(two["resumed"][key], value, atol=WEIGHTS_ATOL, rtol=0, msg=f"resumed: {key}")
        torch.testing.assert_close(one_resumed[key], value, atol=WEIGHTS_ATOL, rtol=0, msg=f"resumed in one: {key}")


def test_a_sharded_bf16_policy_keeps_fp32_masters_and_acts_through_a_bf16_copy(tmp_path):
    """Sharded, the learner holds fp32 masters (what a checkpoint saves) and the policy a whole bf16 copy of
    them; the masters take one process's update on the same rows, up to bf16 compute noise (Adam's first step
    is about ±lr per weight, so a sign flipped by noise shows as one lr: compared on average)."""
    masters, whole, _ = _in_two_processes(_bf16, tmp_path)
    one, _, before = _bf16(str(tmp_path / "one"), World())
    assert set(whole) - set(masters) == {"lm_head.weight"}  # the tied head is saved once, as the model saves it
    for key, master in masters.items():
        value = whole[key]
        assert value.dtype == torch.bfloat16 and master.dtype == torch.float32, key
        assert torch.equal(value, master.to(torch.bfloat16)), key
        update = (one[key] - before[key]).abs().mean()
        assert update > 1e-4, key  # the step changed every tensor
        assert (masters[key] - one[key]).abs().mean() < 0.05 * update, key


def test_a_sharded_learner_shares_prompts_one_gathered_layer_at_a_time(tmp_path, float64_head):
    """FSDP2 learner, rows sharing prompts on one rank and not on the other: every rank runs its prompts ahead
    (FSDP2's gathers are collective), the prompt pass is back-propagated with each layer gathered again for it
    alone (last layer first), and the update equals one process's on the same rows; with gradient checkpointing
    too (the layers replay their forward in the backward)."""
    two_processes = _in_two_processes(_shared_prompts, tmp_path)
    one_process = _shared_prompts(str(tmp_path / "one"), World())
    for checkpointing in (False, True):
        weights2, stats2, gathered = two_processes[checkpointing]
        weights, stats, unsharded = one_process[checkpointing]
        assert unsharded == []  # nothing to gather in one process
        # 2 steps × 4 mini-batches of 4 rows (2 per rank) × 3 layers, in the loss's backward only
        assert [layer for layer, _ in gathered] == [2, 1, 0] * 8, checkpointing
        assert all(flags == [i == layer for i in range(3)] for layer, flags in gathered), checkpointing
        for key, value in weights.items():
            torch.testing.assert_close(weights2[key], value, atol=WEIGHTS_ATOL, rtol=0, msg=f"{checkpointing}: {key}")
        for one, two in zip(stats, stats2, strict=True):
            for key in ("loss", "grad_norm", "entropy"):
                assert two[key] == pytest.approx(one[key], rel=STATS_RTOL, abs=STATS_RTOL), (checkpointing, key)


def _token_rows(step: int) -> list[Sample]:
    """11 rows (mini-batches of 4, 4 and 3: the ranks hold 2 and 1 rows of the last, so one rank runs a copy), those
    with an advantage carrying one per token."""
    gen = random.Random(100 + step)
    rows = [*_rows(step), dataclasses.replace(_rows(step + 50)[6], task=5)]
    for row in rows:
        if row.advantage:
            row.token_advantages = [row.advantage * gen.uniform(0.5, 1.5) for _ in row.completion_ids]
    return rows


def _per_token(tmp: str, world: World) -> dict[str, dict[str, torch.Tensor]]:
    """Two updates of per-token rows with a KL penalty, per loss type, and three with EPO's entropy terms on
    two-turn trajectories split across the ranks: the weights after them."""
    out = {}
    for loss_type in ("grpo", "bnpo"):
        trainer = _trainer(str(Path(tmp) / loss_type), loss_type, world, beta=0.05)
        for step in range(2):
            trainer.update(_token_rows(step), random.Random(step))
        out[loss_type] = _weights(trainer)
    trainer = _trainer(str(Path(tmp) / "epo"), "grpo", world,
                       epo={"coef": 0.5, "penalty": 4.0, "corridor_low": 0.95, "corridor_high": 1.05})
    for step in range(3):  # a row's turn is its branch: each task is one trajectory of two turns
        rows = [dataclasses.replace(row, branch=0, turn=row.branch) for row in _token_rows(step)]
        trainer.update(rows, random.Random(step), step)
    assert len(trainer.term.history) == 3
    out["epo"] = _weights(trainer)
    return out


def test_per_token_advantages_a_kl_penalty_and_epo_train_in_two_processes_as_in_one(tmp_path, float64_head):
    """Rows carrying per-token advantages reach each rank's share and its loss; with β > 0 the copy that evens out
    the ranks' rows adds no gradient (it leaves the loss mask), so two processes update as one does. EPO's
    trajectory weights and entropy history are the whole mini-batch's and the whole step's on every rank."""
    two = _in_two_processes(_per_token, tmp_path)
    one = _per_token(str(tmp_path / "one"), World())
    for loss_type, weights in one.items():
        for key, value in weights.items():
            torch.testing.assert_close(two[loss_type][key], value, atol=WEIGHTS_ATOL, rtol=0, msg=f"{loss_type}: {key}")


def test_loss_weights_add_up_to_the_whole_batch():
    batch = _rows(0)[:5]
    for loss_type in ("bnpo", "grpo", "dr_grpo"):
        weights = [loss_weight(loss_type, World(r, 2).share(batch), batch, World(r, 2)) for r in range(2)]
        assert sum(weights) == pytest.approx(2.0)  # the ranks' mean gradient is the whole batch's
    assert loss_weight("dapo", batch[:2], batch, World(0, 2)) == 1.0  # normalised by num_items_in_batch


def test_a_last_mini_batch_too_small_for_every_rank_joins_the_one_before():
    rows = _rows(0)[:9]
    assert [len(b) for b in mini_batches(rows, 4, World())] == [4, 4, 1]
    assert [len(b) for b in mini_batches(rows, 4, World(0, 2))] == [4, 5]


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.tasks_per_step=1", "rollout.tasks_per_step=1 gives some of the 2 processes nothing to do"),
    ("trainer.warmstart.batch_size=33", "must be a multiple of the 2 processes"),
    ("trainer.role=main", "decoupled trainers run one process each"),
    ("rollout=vllm rollout.vllm.tensor_parallel_size=2", "each process runs its own engine on its own GPU"),
])
def test_a_config_two_processes_cannot_run_fails_before_anything_is_built(override, message):
    cfg = train_config("experiment=embedded", *override.split())
    with pytest.raises(ConfigError, match=message):
        _check_processes(cfg, 2)
    _check_processes(cfg, 1)


@pytest.mark.parametrize("variable", ["ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"])
def test_accelerates_own_sharding_plugins_are_refused(monkeypatch, variable):
    monkeypatch.setenv(variable, "true")
    with pytest.raises(ConfigError, match="shard the learners with trainer.sharding=fsdp2"):
        _check_processes(train_config("experiment=embedded"), 2)


@pytest.mark.parametrize("sharding", ["none", pytest.param("fsdp2", marks=pytest.mark.slow)])
def test_torchrun_two_processes_train_resume_and_write_once(tmp_path, sharding):
    """Two real processes train, checkpoint and resume, and only rank 0 writes. The FSDP2 variant is ``slow``
    (``.ci/run`` runs it): the in-process tests above check the sharded update itself."""
    run_dir = tmp_path / "run"
    common = ["experiment=embedded", "workflow.max_turns=1", "trainer.warmstart.num_examples=64", "env.eval_size=10",
              "trainer.eval_every=0", "rollout.tasks_per_step=4", "logger=none", "progress=false",
              f"trainer.sharding={sharding}",
              f"trainer.warmstart.cache={tmp_path / 'cache'}"]  # a miss: rank 1 draws the demonstrations after it
    done = torchrun(*common, "trainer.steps=2", "trainer.save_every=1", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wandb" not in (done.stdout + done.stderr).lower()  # logger=none: not even transformers' import-time line
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 0, 0, 1, 2, 2]  # eval before warm start, warm start, eval_before; steps 1, 2; final eval
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert sum("step 1/2" in line for line in (run_dir / "train.log").read_text().splitlines()) == 1
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert len(list((tmp_path / "cache").glob("*/metrics.json"))) == 1

    resumed = torchrun(*common, "trainer.steps=3", f"trainer.resume={run_dir}", f"hydra.run.dir={tmp_path / 'r2'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [3, 3]
    assert (run_dir / "checkpoints" / "step_000003").is_dir()


def test_torchrun_two_processes_train_a_critic_with_a_replay_buffer(tmp_path):
    """ArCHer's critic in two real processes: both score and train it together (rows split, values and gradients
    gathered), the buffer and its draws agree, and the checkpoint holds the critic and its buffer."""
    run_dir = tmp_path / "run"
    done = torchrun("~experiment", *FAST[1:], "workflow.max_turns=2", "algorithm=archer", "critic=utterance",
                    "critic.replay_batch_size=8", "critic.learning_rate=1e-3", "trainer.steps=2",
                    f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in steps if "train/reward" in r][-1]
    assert last["critic/shared/replay/size"] > 0 and last["critic/shared/value_loss"] > 0
    state = torch.load(run_dir / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert len(state["critics"]["shared"]["buffer"]["transitions"]) == last["critic/shared/replay/size"]
