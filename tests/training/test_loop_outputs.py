"""What one in-process training run leaves for a researcher: diagnostics, readable completions, train.log."""

import json
import re
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers.utils import logging as hf_logging

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.core.world import World
from marl_cli.plugins import register_configs
from marl_cli.policies.regime import build_policies
from marl_cli.policies.roles import assign_roles
from marl_cli.training.build import build_run, build_team, placement
from marl_cli.training.hooks import step_line
from marl_cli.training.loop import train
from marl_cli.training.warmstart import cached_warm_start, warm_start_all
from tests.helpers import FAST, SMALL

register_configs()
TEAM = [*FAST, *SMALL, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role", "workflow.max_turns=1",
        "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=400", "trainer.warmstart.batch_size=16",
        "trainer.warmstart.epochs=3", "trainer.warmstart.learning_rate=3e-3", "rollout.temperature=1.0",
        "rollout.tasks_per_step=3", "algorithm.num_generations=4", "trainer.mini_batch_size=4",
        "trainer.log_completions_every=1", "trainer.log_ref_kl=true", "trainer.steps=2", "trainer.save_every=1"]


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=[*TEAM, *overrides])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("team") / "run"
    summary = train(_cfg(), run_dir)
    assert summary["status"] == "completed"
    return run_dir


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_every_step_logs_the_diagnostics(run):
    steps = [r for r in _records(run) if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for policy in ("tool", "plan"):
            for key in ("logprob_gap/mean", "logprob_gap/max", "entropy", "kl_old", "kl_ref", "clip_ratio/low_mean",
                        "clip_ratio/high_mean", "advantage/mean", "advantage/std", "mini_batches"):
                assert f"train/{policy}/{key}" in r, (policy, key)
            assert r[f"train/{policy}/logprob_gap/mean"] < 1e-3  # CPU fp32, top-k/top-p off
            assert r[f"train/{policy}/mini_batches"] == 3  # 3 tasks x K=4 rows in mini-batches of 4
        for role in ("tool", "plan"):
            for key in ("completion_tokens", "completion_tokens_max", "finished", "prompts_truncated",
                        "zero_std_fraction"):
                assert f"train/{role}/{key}" in r, (role, key)
    assert steps[0]["train/plan/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the reference is the start of RL
    assert steps[1]["train/plan/kl_ref"] > 0
    assert any(r[f"train/{p}/kl_old"] > 0 for r in steps for p in ("tool", "plan"))


def test_readable_completions_per_agent(run):
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert {(r["step"], r["role"]) for r in train_rows} == {(s, role) for s in (1, 2) for role in ("tool", "plan")}
    assert all(len([r for r in train_rows if (r["step"], r["role"]) == key]) == 4
               for key in {(r["step"], r["role"]) for r in train_rows})
    assert any(r["advantage"] != 0 for r in train_rows)  # the rows as trained, with their advantages
    for r in rows:
        assert {"prompt", "completion", "reward", "advantage", "turn", "role"} <= set(r)
        assert "Answer after ####" in r["prompt"] or "Write Python" in r["prompt"]
    final = [r for r in rows if r["split"] == "eval"]
    assert {r["role"] for r in final} == {"tool", "plan"} and {r["task"] for r in final} <= {0, 1, 2, 3}


def test_train_log_has_steps_checkpoints_and_evals(run):
    text = (run / "train.log").read_text()
    for expected in ("step 1/2 |", "step 2/2 |", "checkpoint: step 1", "checkpoint: step 2", "eval_before:",
                     "warm start base (roles tool, plan)", "completed after 2 steps"):
        assert expected in text, expected
    assert "[plan] loss" in text
    progress = re.findall(r"warm start base: step (\d+)/150 \(\d+%\), loss [\d.]+, \d+ s elapsed, ~\d+ s left", text)
    assert [int(s) for s in progress] == list(range(15, 151, 15))  # one line per tenth of the warm start


def test_step_line_names_each_policy():
    line = step_line(3, 10, {"train/reward": 0.5, "train/success": 0.25, "train/a/loss": 0.1, "train/a/kl_old": 0.01,
                             "time/step_s": 1.5}, ["a", "b"])
    assert line == "step 3/10 | reward 0.5000 | success 0.2500 | [a] loss 0.1 kl_old 0.01 | 1.5 s"


def test_step_line_shows_each_critics_loss_and_explained_variance():
    line = step_line(2, 4, {"train/reward": 0.5, "critic/team/value_loss": 0.25, "critic/team/explained_variance": -0.5,
                            "critic/team/grad_norm": 3.0, "time/step_s": 2.0}, [])
    assert line == "step 2/4 | reward 0.5000 | [critic team] value_loss 0.25 ev -0.5 | 2.0 s"


def test_per_role_policies_start_from_one_warm_started_base(tmp_path):
    few = ("trainer.warmstart.num_examples=24", "trainer.warmstart.epochs=1")
    cfg = _cfg(*few)
    workflow = build_team(cfg)
    role_map = assign_roles(cfg.policy, workflow.roles)
    policies = build_policies(role_map, cfg.model, 0, tmp_path, torch.device("cpu"))
    before = {k: v.clone() for k, v in policies["tool"].model.state_dict().items()}
    metrics = warm_start_all(policies, workflow, cfg, tmp_path, role_map)
    assert "warmstart/base/loss" in metrics and metrics["warmstart/base/examples"] == 48  # 24 per role
    tool, plan = policies["tool"].model.state_dict(), policies["plan"].model.state_dict()
    assert all(torch.equal(tool[k], plan[k]) for k in tool)
    assert any(not torch.equal(before[k], tool[k]) for k in tool)
    separate = build_policies(role_map, cfg.model, 0, tmp_path / "s", torch.device("cpu"))
    metrics = warm_start_all(separate, workflow, _cfg(*few, "trainer.warmstart.shared_base=false"), tmp_path / "s",
                             role_map)
    assert metrics["warmstart/tool/examples"] == 24 and metrics["warmstart/plan/examples"] == 24


def test_identical_warm_starts_run_once_with_a_cache(tmp_path):
    few = ("trainer.warmstart.num_examples=24", "trainer.warmstart.epochs=1",
           f"trainer.warmstart.cache={tmp_path / 'c'}")
    trained = {}
    for regime in ("shared", "per_role", "shared"):
        cfg = _cfg(*few, f"policy={regime}", "env.eval_size=3")
        workflow = build_team(cfg)
        role_map = assign_roles(cfg.policy, workflow.roles)
        policies = build_policies(role_map, cfg.model, 0, tmp_path / regime,
                                  torch.device("cpu"))
        metrics = warm_start_all(policies, workflow, cfg, tmp_path / regime, role_map)
        trained.setdefault(regime, []).append((metrics, policies))
    (first, shared), (again, shared_again) = trained["shared"]
    per_role_metrics, per_role = trained["per_role"][0]
    assert first["warmstart/shared/cached"] == 0.0 and again["warmstart/shared/cached"] == 1.0
    assert per_role_metrics["warmstart/base/cached"] == 1.0  # the team's base trains on the same demonstrations
    weights = shared["shared"].model.state_dict()
    for other in (shared_again["shared"], per_role["tool"], per_role["plan"]):
        assert all(torch.equal(weights[k], v) for k, v in other.model.state_dict().items())
    # a run that differs only in what pays the rows (the team term's weight) warm-starts alike: a hit
    cfg = _cfg(*few, "policy=shared", "env.eval_size=3", "workflow.alpha=0.25")
    workflow = build_team(cfg)
    role_map = assign_roles(cfg.policy, workflow.roles)
    policies = build_policies(role_map, cfg.model, 0, tmp_path / "alpha", torch.device("cpu"))
    assert warm_start_all(policies, workflow, cfg, tmp_path / "alpha", role_map)["warmstart/shared/cached"] == 1.0
    cfg = _cfg(*few, "seed=1")
    workflow = build_team(cfg)
    role_map = assign_roles(cfg.policy, workflow.roles)
    policies = build_policies(role_map, cfg.model, 1, tmp_path / "s1",
                              torch.device("cpu"))
    assert warm_start_all(policies, workflow, cfg, tmp_path / "s1", role_map)["warmstart/base/cached"] == 0.0
    # the same config over an edited prompt (code, not config) demonstrates differently: a new entry
    cfg = _cfg(*few, "policy=shared", "env.eval_size=3")
    workflow = build_team(cfg)
    prompt = type(workflow).prompt
    role_map = assign_roles(cfg.policy, workflow.roles)
    policies = build_policies(role_map, cfg.model, 0, tmp_path / "edited",
                              torch.device("cpu"))
    with mock.patch.object(type(workflow), "prompt", lambda self, role, state: prompt(self, role, state) + "!"):
        assert warm_start_all(policies, workflow, cfg, tmp_path / "edited", role_map)["warmstart/shared/cached"] == 0.0


def test_a_cache_hit_spares_the_other_ranks_drawing_the_demonstrations(tmp_path):
    """Rank 0 draws the demonstrations for the cache key; a rank told of rank 0's hit loads nothing and draws
    nothing (a code family's oracle runs the sandbox for every demonstration)."""
    cfg = _cfg("trainer.warmstart.num_examples=24", "trainer.warmstart.epochs=1", "policy=shared",
               f"trainer.warmstart.cache={tmp_path / 'c'}")
    workflow = build_team(cfg)

    def policy(name: str):
        return build_policies(assign_roles(cfg.policy, workflow.roles), cfg.model, 0, tmp_path / name,
                              torch.device("cpu"))["shared"]

    first = cached_warm_start(policy("main"), workflow, cfg, tmp_path / "main")
    assert first["cached"] == 0.0
    rank0 = {k: v for k, v in first.items() if k != "cached"}
    other = policy("other")
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with mock.patch.object(World, "from_main", side_effect=[True, rank0]), \
            mock.patch("marl_cli.training.warmstart.demonstrations", side_effect=AssertionError("drawn")):
        told = cached_warm_start(other, workflow, cfg, tmp_path / "other", World(1, 2))
    assert told == {**rank0, "cached": 1.0}
    assert all(torch.equal(before[k], v) for k, v in other.model.state_dict().items())  # rank 0's come later


def test_a_pinned_warm_start_seed_gives_every_run_seed_the_same_warm_start(tmp_path):
    few = ("trainer.warmstart.num_examples=24", "trainer.warmstart.epochs=1", "env.eval_size=3")
    warmed = {}
    for seed, pinned in ((0, None), (1, 0), (2, 0), (1, None)):
        cfg = _cfg(*few, f"seed={seed}", f"trainer.warmstart.seed={'null' if pinned is None else pinned}")
        run = build_run(cfg, tmp_path / f"{seed}-{pinned}")
        warm_start_all(run.policies, run.workflow, cfg, run.run_dir, run.role_map)
        warmed[seed, pinned] = (run.policies["tool"].model.state_dict(), run.workflow.env.task("train", 0))
    reference, _ = warmed[0, None]
    for key in ((1, 0), (2, 0)):
        assert all(torch.equal(reference[k], v) for k, v in warmed[key][0].items())
    assert any(not torch.equal(reference[k], v) for k, v in warmed[1, None][0].items())
    assert warmed[1, 0][1] != warmed[2, 0][1]  # the RL tasks still follow the run seed


def test_per_role_policies_are_placed_on_their_devices_in_turn(tmp_path):
    cfg = _cfg("policy.devices=[cpu,cpu]", "trainer.warmstart.enabled=false")
    run = build_run(cfg, tmp_path)
    assert {n: str(p.model.device) for n, p in run.policies.items()} == {"tool": "cpu", "plan": "cpu"}
    assert list(placement(cfg, run.role_map).by_policy) == ["tool", "plan"]
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device='cuda:1' but no CUDA device is visible"):
            build_run(_cfg("policy.devices=[cpu,cuda:1]"), tmp_path / "cuda")


def test_a_step_with_nothing_to_train_warns_is_counted_and_moves_no_weight(tmp_path, caplog):
    """The untrained tiny model never writes the answer format: every reward is equal, ``zero_std`` drops
    every group, and each step has no row to train on."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*FAST, "trainer.steps=2", "algorithm.filter=zero_std"])
    run = tmp_path / "run"
    with caplog.at_level("WARNING", logger="marl_cli"), warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        assert train(cfg, run)["status"] == "completed"
    assert not [w for w in raised if "lr_scheduler" in str(w.message)]  # the schedule's advance says nothing
    warned = [r.getMessage() for r in caplog.records if "nothing to train" in r.getMessage()]
    assert len(warned) == 2 and warned[0].startswith("step 1: nothing to train policy 'shared' on (")
    assert "none kept by algorithm.filter" in warned[0] and "train/shared/skipped_steps = 1" in warned[0]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/shared/skipped_steps"] for r in steps if "train/reward" in r] == [1.0, 2.0]
    assert not any("train/shared/grad_norm" in r for r in steps)


def test_piped_output_has_one_plain_line_per_step_and_no_bar_frames(tmp_path, caplog, capsys):
    """Under pytest stderr is no terminal: no tqdm frames (joined by carriage returns), and each step's line
    is logged even on steps ``log_every`` leaves out of metrics.jsonl."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*FAST, "trainer.steps=3", "trainer.log_every=2", "progress=true"])
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # as `marl` does (cli.app.run_job): transformers' loading bars
    try:
        with caplog.at_level("INFO", logger="marl_cli"):
            assert train(cfg, tmp_path / "run")["status"] == "completed"
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" |")[0] for line in lines] == ["step 1/3", "step 2/3", "step 3/3"]
    assert re.search(r"\| tokens agent \d+\.\d \(max \d+\) \|", lines[0]), lines[0]
    assert "\r" not in capsys.readouterr().err


def test_step_line_shows_each_agents_completion_tokens():
    metrics = {"train/reward": 0.5, "train/plan/completion_tokens": 12.25, "train/plan/completion_tokens_max": 20.0,
               "train/tool/completion_tokens": 8.0, "train/tool/completion_tokens_max": 9.0, "time/step_s": 2.0}
    assert step_line(1, 5, metrics, [], ("plan", "tool")) == \
        "step 1/5 | reward 0.5000 | tokens plan 12.2 (max 20), tool 8.0 (max 9) | 2.0 s"
