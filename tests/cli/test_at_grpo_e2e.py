"""End-to-end AT-GRPO: tool→plan tree rollouts under each policy regime (in this process, as ``marl train``
runs them), and one AT-GRPO run per task family through the command itself (slow)."""

import json
from pathlib import Path

import pytest

from marl_cli.training.loop import train
from tests.helpers import FAST, marl, train_config

AT = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "workflow.max_turns=2", "trainer.steps=2",
      "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16", "trainer.warmstart.batch_size=8",
      "policy.lora_r=4", "policy.lora_alpha=8"]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("regime", ["shared", "per_role", "lora_per_role"])
def test_at_grpo_runs_under_every_regime(regime, tmp_path):
    run = tmp_path / "r"
    train(train_config(*AT, f"policy={regime}"), run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algorithm"] == "at_grpo"
    names = {"shared": ["shared"], "per_role": ["plan", "tool"], "lora_per_role": ["plan", "tool"]}[regime]
    assert sorted(summary["policies"]) == names
    steps = [r for r in _records(run) if "train/success" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for role in ("tool", "plan"):
            for key in ("reward", "success", "format_failure", "zero_std_fraction"):
                assert f"train/{role}/{key}" in r
        rows = sum(r[f"train/{name}/rows"] + r[f"train/{name}/dropped_rows"] for name in names)
        assert rows % 3 == 0 and rows >= 2 * 3 * 2  # K=3 candidates per (task, turn, agent), 2 tasks, 2 agents
        assert r["train/generate_calls"] >= 2  # tool then plan: one call per policy per stage
    assert "eval/plan_path/success" in summary
    last = sorted((run / "checkpoints").iterdir())[-1] / "policies"
    if regime == "lora_per_role":
        assert (run / "lora_base" / "config.json").exists()
        assert all((last / n / "adapter_model.safetensors").exists() for n in names)


def test_lora_run_resumes_from_its_adapters(tmp_path):
    run = tmp_path / "r"
    assert train(train_config(*AT, "policy=lora_per_role", "trainer.steps=1"), run)["steps"] == 1
    train(train_config(*AT, "policy=lora_per_role", "trainer.steps=2", f"trainer.resume={run}"), tmp_path / "again")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert [r["step"] for r in _records(run) if "train/success" in r] == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("family", [
    ["env=plan_path", "env.size=4", "workflow=tool_plan"],
    ["env=sudoku", "workflow=tool_plan"],
    ["env=sokoban", "workflow=tool_plan"],
    ["env=math", "workflow=tool_reason"],
    ["env=code", "workflow=code_test", "sandbox.timeout_s=2", "sandbox.cpu_seconds=1"],
], ids=lambda f: f[0])
def test_every_family_trains_with_at_grpo(family, tmp_path):
    fast = [o for o in FAST if not o.startswith("env.size")]
    out = marl("train", *fast, *family, "algorithm=at_grpo", "workflow.max_turns=2", "trainer.steps=2",
               "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=16", "trainer.warmstart.batch_size=8",
               f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    env = family[0].split("=")[1]
    assert 0.0 <= summary[f"eval/{env}/success"] <= 1.0
