"""End-to-end ``marl eval``: a trained run's checkpoint evaluated again gives the run's own final eval."""

import json

from marl_cli.training.loop import train
from tests.helpers import FAST, cli, train_config


def test_eval_of_a_run_reproduces_its_final_greedy_eval(tmp_path):
    team = [*FAST, "workflow=tool_plan", "policy=per_role"]
    run = tmp_path / "run"
    train(train_config(*team, "algorithm=at_grpo", "trainer.steps=1"), run)
    trained = json.loads((run / "summary.json").read_text())

    ev = tmp_path / "eval"
    out = cli("eval", *team, f"load={run}", f"hydra.run.dir={ev}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((ev / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["command"] == "eval"
    assert summary["loaded_step"] == 1 and summary["load"].endswith("checkpoints/step_000001")
    assert summary["policies"] == {"tool": ["tool"], "plan": ["plan"]}
    for key in ("eval/success", "eval/tool/reward", "eval/plan/reward", "eval/plan/completion_tokens"):
        assert summary[key] == trained[key], key  # greedy on the same held-out tasks with the same weights
    assert summary["eval/pass@1"] == summary["eval/success"]
    assert [json.loads(line)["step"] for line in (ev / "metrics.jsonl").read_text().splitlines()] == [0]

    out = cli("eval", *FAST, "policy=per_role", f"load={run}", f"hydra.run.dir={tmp_path / 'solo'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"marl eval: error: load={run}/checkpoints/step_000001: no saved model for policies ['agent']; it has "
        "['plan', 'tool'] (map roles to them with +policy.assignment.<role>=<policy>)"]
