"""Methods on one axis: one figure per task, each method's held-out eval curve with a band over seeds."""

from __future__ import annotations

import pytest

from marl_cli.report import make_report
from marl_cli.report.compare import eval_points, task_curves
from marl_cli.report.runs import load_runs
from tests.report.rundirs import make_run

PNG = b"\x89PNG\r\n\x1a\n"
TABLE = "Toy AT-GRPO table"
SETUPS = (("single_agent", "grpo"), ("tool_plan", "at_grpo"))  # single agent + GRPO; AT-GRPO, shared policy


def evals(start: float, gain: float, steps: int = 30, every: int = 10) -> list[dict]:
    """metrics.jsonl records of a run's held-out evals: before RL, every ``every`` steps and after the last."""
    records = [{"step": 0, "eval_before/success": start}]
    records += [{"step": s, "train/reward": 0.1, "eval/success": start + gain * s / steps}
                for s in range(every, steps + 1, every)]
    return records


def table_runs(root, benchmarks=("Plan-Path",)) -> None:
    for benchmark in benchmarks:
        for i, (workflow, algorithm) in enumerate(SETUPS):
            for seed in (0, 1, 2):
                make_run(root, f"{benchmark}/{workflow}/{seed}", workflow=workflow, algorithm=algorithm, seed=seed,
                         steps=30, success=0.3 + 0.2 * i + 0.02 * seed, metrics=evals(0.3, 0.2 * i + 0.02 * seed),
                         report={"table": TABLE, "benchmark": benchmark})


def test_eval_points_join_the_start_and_every_eval_in_percent():
    assert eval_points(evals(0.25, 0.5, steps=20)) == [{"step": 0, "value": 25.0}, {"step": 10, "value": 50.0},
                                                       {"step": 20, "value": 75.0}]
    assert eval_points([{"step": 3, "eval/pass@1": 0.5}], "pass@1") == [{"step": 3, "value": 50.0}]


def test_one_curve_per_method_with_mean_and_std_over_seeds(tmp_path):
    table_runs(tmp_path)
    make_run(tmp_path, "short", workflow="tool_plan", algorithm="at_grpo", policy="per_role", steps=2,
             success=0.1, metrics=evals(0.3, -0.2, steps=2, every=1), report={"table": TABLE, "benchmark": "Plan-Path"},
             overrides=["experiment=toy/table/plan_path_at_grpo_per_role", "trainer.steps=2"])
    curves = task_curves(load_runs([str(tmp_path)]))
    assert list(curves) == [(TABLE, "Plan-Path")]
    labels = [label for label, _ in curves[(TABLE, "Plan-Path")]]
    assert labels == ["single agent + GRPO (n=3)", "AT-GRPO, shared policy (n=3)",
                      "AT-GRPO, per-role policies (budget differs) (n=1)"]
    grpo = curves[(TABLE, "Plan-Path")][0][1]
    assert grpo.steps == [0, 10, 20, 30]
    assert grpo.mean[-1] == pytest.approx(32.0) and grpo.std[-1] == pytest.approx(2.0)
    assert curves[(TABLE, "Plan-Path")][2][1].std is None  # one seed: no band


def test_plot_writes_one_methods_figure_per_task(tmp_path):
    table_runs(tmp_path / "runs", benchmarks=("Plan-Path", "Sudoku"))
    report = make_report([str(tmp_path / "runs")], tmp_path / "out", plot=True)
    figures = sorted(p.name for p in report.files if p.name.endswith("__methods.png"))
    assert figures == ["Toy_AT-GRPO_table__Plan-Path__methods.png", "Toy_AT-GRPO_table__Sudoku__methods.png"]
    assert (tmp_path / "out" / "plots" / figures[0]).read_bytes().startswith(PNG)
