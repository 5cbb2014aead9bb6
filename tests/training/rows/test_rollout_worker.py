"""Asynchronous rollouts (``trainer.max_staleness``): the schedule and its staleness, the worker's rows equal to
the same step played in this process, and runs that are reproducible, resume exactly after a signal or a killed
worker, and stop with one line on a stuck one."""

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from marl_cli.config.errors import RunError
from marl_cli.training.build import build_run
from marl_cli.training.hooks import Hook
from marl_cli.training.learner import policy_trainer
from marl_cli.training.loop import Trainer, train
from marl_cli.training.rows.rollout_worker import RolloutWorker, step_seed, step_tasks
from marl_cli.training.rows.sources import AsyncRows, RolloutRows, row_source
from tests.helpers import FAST, SMALL, marl, torch_threads, train_config

WARM = ["trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=400", "trainer.warmstart.batch_size=16",
        "trainer.warmstart.epochs=3", "trainer.warmstart.learning_rate=3e-3"]
RUN = [*FAST, *SMALL, *WARM, "threads=1", "rollout.temperature=1.0", "trainer.steps=4", "trainer.mini_batch_size=2",
       "trainer.max_staleness=1", "trainer.log_completions_every=1"]
"""Four steps that train (the warm start gives answers that parse, so rewards differ within groups)."""
VARYING = ("time/", "async/wait_s", "async/worker_rollout_s")
"""What two runs of one config may differ in: wall-clock figures (and whether the warm start came from its cache)."""


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VARYING) and not k.endswith("/cached")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "step_000004" / "policies" / "shared" / "model.safetensors")


def _same_run(run: Path, whole: Path) -> None:
    """``run`` ended where ``whole`` did: each step once, the same metrics and final weights."""
    assert [m["step"] for m in _metrics(run)] == [m["step"] for m in _metrics(whole)]
    for mine, theirs in zip(_metrics(run), _metrics(whole), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    for key, value in _weights(whole).items():
        torch.testing.assert_close(_weights(run)[key], value, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return f"trainer.warmstart.cache={tmp_path_factory.mktemp('warm')}"


@pytest.fixture(scope="module")
def whole(tmp_path_factory, cache) -> Path:
    run = tmp_path_factory.mktemp("whole") / "run"
    assert train(train_config(*RUN, cache), run)["status"] == "completed"
    return run


class _AtStep(Hook):
    """Send ``signum`` to the run's rollout worker once step ``step`` is done."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_step(self, trainer, step, metrics, rows) -> None:
        if step == self.step:
            os.kill(trainer.source.worker.process.pid, self.signum)


def _fit(cfg, run: Path, hook: Hook) -> dict:
    trainer = Trainer(build_run(cfg, run))
    trainer.hooks.append(hook)  # after the checkpoint hook: the step's checkpoint is written first
    return trainer.fit()


def test_each_steps_episodes_have_a_seed_of_their_own():
    assert step_seed(0, 3, 0) == step_seed(0, 3, 0) != step_seed(0, 3, 1) != step_seed(0, 4, 0)


def test_max_staleness_0_is_the_synchronous_source(tmp_path):
    assert type(row_source(build_run(train_config(*FAST), tmp_path / "sync"))) is RolloutRows
    assert type(row_source(build_run(train_config(*FAST, "trainer.max_staleness=2"), tmp_path / "async"))) \
        is AsyncRows


def test_the_worker_plays_a_step_as_this_process_would_from_the_version_it_is_due(tmp_path):
    cfg = train_config(*FAST, "threads=1", "rollout.temperature=1.0", "trainer.max_staleness=1")
    run = build_run(cfg, tmp_path / "run")
    worker = RolloutWorker(run, 0, 1)
    try:
        def here(step: int):
            """The step played in this process, on the worker's one thread (float sums depend on the split)."""
            torch.manual_seed(step_seed(cfg.seed, step, 0))
            tasks = step_tasks(run.workflow, step, cfg.rollout.tasks_per_step)
            with torch_threads(cfg.threads):
                return run.rollout.play(tasks, cfg.algorithm.num_generations,
                                        random.Random(step_seed(cfg.seed, step, 0)))

        def same(played, mine) -> None:
            assert [(s.task, s.branch, s.completion_ids, s.sampling_logprobs) for s in played.result.samples] == \
                   [(s.task, s.branch, s.completion_ids, s.sampling_logprobs) for s in mine.samples]

        first = worker.receive(1)
        assert (first.step, first.version) == (1, 0) and {s.policy_version for s in first.result.samples} == {0}
        same(first, here(1))
        policy = run.policies["shared"]
        with torch.no_grad():
            policy.model.get_output_embeddings().weight.mul_(3.0)  # "update 1": sharper logits
        policy.mark_updated()
        worker.send(1, run.policies)
        assert worker.receive(2).version == 0  # step 2 was due from version 0, played before the send
        third = worker.receive(3)
        assert third.version == 1
        same(third, here(3))
    finally:
        worker.stop()
    assert not worker.process.is_alive()


def test_a_run_reports_each_rows_staleness_and_is_reproducible(tmp_path, whole, cache):
    metrics = [m for m in _metrics(whole) if "train/reward" in m]
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]  # step s from update s - 2
    records = [json.loads(line) for line in (whole / "samples.jsonl").read_text().splitlines()]
    train_rows = [r for r in records if r["split"] == "train"]
    assert train_rows and all(r["staleness"] == min(1, r["step"] - 1) for r in train_rows)
    assert any(m["train/shared/grad_norm"] > 0 for m in metrics)  # the steps train: the weights move
    again = tmp_path / "again"
    train(train_config(*RUN, cache), again)
    assert _metrics(again) == _metrics(whole)  # exactly: the schedule, not the timing, decides every row
    for key, value in _weights(whole).items():
        assert torch.equal(_weights(again)[key], value)


def test_a_signal_mid_update_checkpoints_the_rows_played_ahead_and_the_resume_is_exact(tmp_path, monkeypatch,
                                                                                      whole, cache):
    run = tmp_path / "run"
    clip, count = torch.nn.utils.clip_grad_norm_, [0]

    def clip_and_signal(*args, **kwargs):
        count[0] += 1
        if count[0] == 4:  # during step 2's update
            os.kill(os.getpid(), signal.SIGTERM)
        return clip(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(policy_trainer.torch.nn.utils, "clip_grad_norm_", clip_and_signal)
        with pytest.raises(KeyboardInterrupt):
            train(train_config(*RUN, cache), run)
    state = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    ahead = state["in_flight"]["ranks"][0]
    assert list(ahead) == [3] and ahead[3].version == 1  # step 3, played from update 1, is in the checkpoint
    assert train(train_config(*RUN, cache, f"trainer.resume={run}"), tmp_path / "unused")["status"] == "completed"
    _same_run(run, whole)


def test_a_killed_worker_stops_the_run_with_one_line_and_the_resume_is_exact(tmp_path, whole, cache):
    run = tmp_path / "run"
    with pytest.raises(RunError, match=r"rollout worker .* exited with code -9 while playing step \d; the newest "
                                       r"checkpoint stands: go on with trainer.resume="):
        _fit(train_config(*RUN, cache, "trainer.save_every=1"), run, _AtStep(2, signal.SIGKILL))
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    with pytest.raises(RunError, match=r"exited with code -9 while playing step \d; no checkpoint was written yet: "
                                       r"start the run again"):
        _fit(train_config(*RUN, cache), tmp_path / "early", _AtStep(1, signal.SIGKILL))
    assert (run / "checkpoints" / "step_000002").exists()
    assert train(train_config(*RUN, cache, f"trainer.resume={run}"), tmp_path / "unused")["status"] == "completed"
    _same_run(run, whole)


def test_a_stuck_worker_is_stopped_within_its_heartbeat_timeout(tmp_path, cache):
    stuck = _AtStep(1, signal.SIGSTOP)
    start = []

    class Clock(Hook):
        def on_step(self, trainer, step, metrics, rows) -> None:
            if step == 1:
                start.append(time.monotonic())

    trainer = Trainer(build_run(train_config(*RUN, cache, "trainer.heartbeat_timeout_s=3"), tmp_path / "run"))
    trainer.hooks += [Clock(), stuck]
    with pytest.raises(RunError, match=r"has not reported for \d+ s \(trainer.heartbeat_timeout_s=3\) while playing "
                                       r"step \d: it is stuck and was stopped"):
        trainer.fit()
    assert time.monotonic() - start[0] < 3 + 10  # the timeout, plus the learner's step and a poll
    assert not trainer.source.worker.process.is_alive()


def _two_processes_async(tmp: str, world) -> dict:
    """Under a launcher: each process's worker plays its share; a resume in two processes takes its own share of
    the rows played ahead."""
    run = Path(tmp) / "run"
    common = [*FAST, "threads=1", "trainer.max_staleness=1", "trainer.mini_batch_size=2"]
    train(train_config(*common, "trainer.steps=3", "trainer.save_every=2"), run)
    state = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    torch.distributed.barrier()
    if world.rank == 0:  # as if killed before step 3's checkpoint
        shutil.rmtree(run / "checkpoints" / "step_000003")
    torch.distributed.barrier()
    summary = train(train_config(*common, "trainer.steps=3", f"trainer.resume={run}"), Path(tmp) / "unused")
    return {"ahead": state["in_flight"]["ranks"], "metrics": _metrics(run), "summary": summary}


def test_two_processes_each_run_a_worker_for_their_share_and_resume(tmp_path):
    from tests.training.rows.test_distributed import _in_two_processes

    out = _in_two_processes(_two_processes_async, tmp_path)
    assert out["summary"]["status"] == "completed"
    assert [sorted(rank) for rank in out["ahead"]] == [[3], [3]]  # each rank's share of step 3, played from update 1
    assert {s.task for rank in out["ahead"] for s in rank[3].result.samples} == {0, 1}  # task 0 on rank 0, 1 on 1
    steps = [m for m in out["metrics"] if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3] and [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 1.0]


def test_a_sweep_job_of_the_cpu_launcher_starts_its_worker(tmp_path):
    """Hydra's joblib launcher runs a job in a loky process, whose default start method a spawned worker cannot
    set up: the worker starts under ``spawn`` there too."""
    done = marl("train", "-m", "hydra/launcher=cpu", "threads=1", *FAST, "trainer.steps=2",
                "trainer.max_staleness=1,2", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*/*/summary.json")]
    assert len(summaries) == 2 and all(s["status"] == "completed" for s in summaries)


@pytest.mark.parametrize("overrides", [
    ["workflow=tool_plan", "algorithm=at_grpo", "policy=per_role", "workflow.max_turns=1"],  # trees, two models
    ["workflow=tool_plan", "algorithm=at_grpo", "policy=lora_per_role", "policy.lora_r=4", "workflow.max_turns=1",
     "trainer.swap_roles_every=1"],  # adapters, and roles that change policy every step
    ["workflow.max_turns=2", "algorithm=ppo", "critic=token"],  # a critic scores the rows the worker played
], ids=["tree-per-role", "lora-swap", "ppo-critic"])
def test_every_kind_of_run_trains_with_a_rollout_worker(tmp_path, overrides):
    run = tmp_path / "run"
    assert train(train_config(*FAST, "threads=1", *overrides, "trainer.steps=3", "trainer.max_staleness=2"),
                 run)["status"] == "completed"
    steps = [m for m in _metrics(run) if "train/reward" in m]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 2.0]


def test_a_worker_left_without_weights_stops_the_run_with_its_reason(tmp_path, monkeypatch):
    update = policy_trainer.PolicyTrainer.update

    def slow_update(self, *args, **kwargs):
        time.sleep(3.0)  # the worker plays step 2, then waits for update 1 (step 3's) longer than its limit
        return update(self, *args, **kwargs)

    monkeypatch.setattr(policy_trainer.PolicyTrainer, "update", slow_update)
    cfg = train_config(*FAST, "threads=1", "trainer.steps=3", "trainer.max_staleness=1",
                       "trainer.weight_sync_timeout_s=0.5")
    with pytest.raises(RunError, match=r"the rollout worker failed while playing step 3: TimeoutError: waited 1 s "
                                       r"for the learner's weights after version 0 "
                                       r"\(trainer.weight_sync_timeout_s=0.5\)"):
        train(cfg, tmp_path / "run")
