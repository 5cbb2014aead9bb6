"""A team trained against a scripted partner, in this process as ``marl train`` runs it: Plan-Path's tool agent
learns (AT-GRPO, tree rollouts) beside a plan role the env's oracle plays (``policy.scripted.plan=oracle``)."""

import json
from pathlib import Path

import pytest

from marl_cli.training.loop import train
from tests.helpers import FAST, train_config

SCRIPTED = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "+policy.scripted.plan=oracle", "workflow.max_turns=2",
            "policy.lora_r=4", "policy.lora_alpha=8", "trainer.steps=2", "trainer.warmstart.enabled=true",
            "trainer.warmstart.num_examples=16", "trainer.warmstart.batch_size=8", "trainer.log_completions_every=1"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("regime", ["per_role", "lora_per_role"])
def test_the_tool_agent_trains_beside_an_oracle_plan_agent(tmp_path, regime):
    run = tmp_path / "r"
    summary = train(train_config(*SCRIPTED, f"policy={regime}"), run)
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["policies"] == {"tool": ["tool"]}  # no model for the scripted role
    records = _lines(run / "metrics.jsonl")
    steps = [r for r in records if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert "train/tool/rows" in r and not any(k.startswith(("train/plan/rows", "train/scripted")) for k in r)
        assert r["train/plan/success"] == 1.0 and r["train/plan/completion_tokens"] == 0.0  # the oracle solves
        assert "train/tool/success" in r
    warm = "lora_base" if regime == "lora_per_role" else "tool"
    assert {k.split("/")[1] for r in records for k in r if k.startswith("warmstart/")} == {warm}
    assert next(r for r in records if f"warmstart/{warm}/examples" in r)[f"warmstart/{warm}/examples"] == 16  # tool's
    assert summary["eval/success"] == 1.0 and summary["eval/plan/success"] == 1.0
    last = sorted((run / "checkpoints").iterdir())[-1] / "policies"
    assert sorted(p.name for p in last.iterdir()) == ["tool"]
    rows = _lines(run / "samples.jsonl")
    assert {r["policy"] for r in rows if r["role"] == "plan"} == {"scripted:oracle"}
    assert {r["policy"] for r in rows if r["role"] == "tool"} == {"tool"}
