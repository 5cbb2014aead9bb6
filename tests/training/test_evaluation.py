"""Evaluation: the pass@k estimator, pass@k over real episodes, and loading policies from checkpoints."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.policies.regime import load_checkpoint
from marl_cli.policies.roles import assign_roles
from marl_cli.policies.tiny import save_tiny
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.training.build import Run, build_team, resolve_load
from marl_cli.training.evaluation import evaluate, pass_at_k
from tests.helpers import FAST, TINY, ScriptedGenerator, train_config

register_configs()


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="eval", overrides=[*TINY, "logger=none", *overrides])


def test_pass_at_k_matches_hand_counts():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 0, 3) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 3, 2) == 1.0  # any two of four include a correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_evaluate_counts_pass_at_k_per_task(tmp_path):
    """Task t is answered correctly on its first t % 3 of 3 samples: c = 0, 1, 2, 0, 1, 2."""
    cfg = _cfg("env.size=4", "env.eval_size=6")
    workflow = build_team(cfg)
    tasks = [workflow.env.task("eval", i) for i in range(6)]
    prompt_of = {workflow.prompt("agent", workflow.initial_state(t)): i for i, t in enumerate(tasks)}
    seen: Counter = Counter()

    def answer(policy, prompt, rng):
        t = prompt_of[prompt]
        seen[t] += 1
        right = seen[t] <= t % 3
        return workflow.demonstration("agent", workflow.initial_state(tasks[t])) if right else "#### U U U U U U U"

    policies = {"shared": type("P", (), {"name": "shared"})()}
    sampling = Sampling(temperature=1.0)
    rollout = Rollout(workflow, policies, {"agent": "shared"}, ScriptedGenerator(answer), Sampling(0.0), sampling)
    run = Run(cfg, tmp_path, {"agent": "shared"}, rollout)
    metrics = evaluate(run, samples=3, pass_k=(1, 2, 3))
    assert run.generator.started == [["shared"]]  # the backend started the acting policies before playing
    assert metrics["eval/success"] == pytest.approx(6 / 18)
    assert metrics["eval/pass@1"] == pytest.approx(6 / 18)
    assert metrics["eval/pass@2"] == pytest.approx((0 + 2 / 3 + 1) * 2 / 6)
    assert metrics["eval/pass@3"] == pytest.approx(4 / 6)
    assert metrics["eval/tasks"] == 6 and metrics["eval/plan_path/success"] == metrics["eval/success"]


@pytest.mark.parametrize("overrides,message", [
    (["eval.samples=4"], "repeats one greedy episode"),
    (["eval.samples=2", "eval.temperature=1", "eval.pass_k=[1,3]"], "between 1 and eval.samples=2"),
    (["eval.samples=0"], r"eval.samples=0: must be >= 1"),
    (["rollout.backend=sglang"], "rollout.backend='sglang' is not registered"),
])
def test_bad_eval_settings_are_refused_before_the_run_dir(tmp_path, overrides, message):
    from marl_cli.training.evaluation import run_evaluation

    with pytest.raises(ConfigError, match=message):
        run_evaluation(_cfg(*overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _checkpoint(root: Path, names: list[str], seed: int = 0) -> Path:
    cfg = _cfg()
    ckpt = root / "checkpoints" / "step_000003"
    for i, name in enumerate(names):
        save_tiny(cfg.model.tiny, seed + i, ckpt / "policies" / name)
    (ckpt / "state.pt").write_bytes(b"")
    return ckpt


def test_resolve_load_takes_a_run_dir_or_a_checkpoint(tmp_path):
    ckpt = _checkpoint(tmp_path / "run", ["shared"])
    assert resolve_load(str(tmp_path / "run")) == (tmp_path / "run", ckpt)
    assert resolve_load(str(ckpt)) == (tmp_path / "run", ckpt)
    with pytest.raises(ConfigError, match="no such run"):
        resolve_load(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a checkpoint"):
        resolve_load(str(tmp_path / "empty"))


def _weights(policy):
    return policy.model.model.embed_tokens.weight.detach().clone()


def test_policies_load_by_name_or_from_a_checkpoints_only_policy(tmp_path):
    per_role = _checkpoint(tmp_path / "pr", ["tool", "plan"])
    cfg = _cfg("workflow=tool_plan", "policy=per_role")
    role_map = assign_roles(cfg.policy, ["tool", "plan"])
    loaded = load_checkpoint(cfg, role_map, tmp_path / "pr", per_role, torch.device("cpu"), tmp_path / "w")
    assert not torch.equal(_weights(loaded["tool"]), _weights(loaded["plan"]))
    assert loaded["tool"].source.endswith("policies/tool")

    single = _checkpoint(tmp_path / "single", ["shared"])
    loaded = load_checkpoint(cfg, role_map, tmp_path / "single", single, torch.device("cpu"), tmp_path / "w")
    assert torch.equal(_weights(loaded["tool"]), _weights(loaded["plan"]))  # the single agent plays both roles

    solo = _cfg("workflow=single_agent", "policy=per_role")
    with pytest.raises(ConfigError, match=r"no saved model for policies \['agent'\].*policy.assignment"):
        load_checkpoint(solo, assign_roles(solo.policy, ["agent"]), tmp_path / "pr", per_role, torch.device("cpu"),
                      tmp_path / "w")
    lora = _cfg("workflow=tool_plan", "policy=lora_per_role")
    with pytest.raises(ConfigError, match="holds full models"):
        load_checkpoint(lora, role_map, tmp_path / "pr", per_role, torch.device("cpu"), tmp_path / "w")


def test_a_training_runs_evaluations_play_as_eval_says(tmp_path):
    """One ``eval`` group for the evaluations of a training run and for ``marl eval``: n samples a task at
    ``eval.temperature``, with pass@k."""
    from marl_cli.training.loop import train

    cfg = train_config(*FAST, "trainer.steps=1", "trainer.eval_every=1", "eval.samples=2", "eval.temperature=1.0",
                       "eval.pass_k=[1,2]")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    for prefix in ("eval_before", "eval"):
        assert summary[f"{prefix}/pass@1"] == pytest.approx(summary[f"{prefix}/success"])
        assert summary[f"{prefix}/pass@2"] >= summary[f"{prefix}/pass@1"]
    greedy = train(train_config(*FAST, "trainer.steps=0"), tmp_path / "greedy")
    assert "eval_before/success" in greedy and not any("pass@" in key for key in greedy)
