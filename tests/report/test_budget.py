"""A run whose overrides change its experiment's budget is marked in the table, with how it differs."""

from __future__ import annotations

import csv
import io

from marl_cli.report import make_report
from marl_cli.report.budget import budget_differences, experiment_of
from tests.report.rundirs import make_run

EXPERIMENT = "experiment=toy/table/plan_path_grpo"  # pins trainer.steps=30, rollout.tasks_per_step=48


def test_budget_overrides_are_compared_with_the_experiments_values():
    config = {"trainer": {"steps": 2, "learning_rate": 1e-3}, "rollout": {"tasks_per_step": 48}}
    overrides = [EXPERIMENT, "trainer.steps=2", "rollout.tasks_per_step=48", "trainer.learning_rate=1e-3", "seed=1"]
    assert experiment_of(overrides) == "toy/table/plan_path_grpo"
    assert budget_differences(config, overrides) == ["trainer.steps=2 (experiment: 30)"]  # 48 is the experiment's
    assert budget_differences(config, ["trainer.steps=2"]) == []  # no experiment: nothing to differ from
    assert budget_differences(config, [EXPERIMENT, "trainer.learning_rate=1e-3"]) == []  # not a budget key
    assert budget_differences(config, ["experiment=no/such/file", "trainer.steps=2"]) == []


def test_a_row_with_another_budget_gets_a_footnote(tmp_path):
    table = {"table": "Toy AT-GRPO table", "benchmark": "Plan-Path"}
    for seed in (0, 1):
        make_run(tmp_path, f"full/{seed}", seed=seed, steps=30, report=table, overrides=[EXPERIMENT])
    make_run(tmp_path, "short", steps=2, report={**table, "method": "AT-GRPO, shared policy"},
             overrides=["experiment=toy/table/plan_path_at_grpo_shared", "trainer.steps=2"])
    report = make_report([str(tmp_path)], tmp_path / "out")
    lines = report.markdown.splitlines()
    assert "| AT-GRPO, shared policy [^1] | 50.0 |" in lines
    assert "| single agent + GRPO | 50.0 ± 0.0 (n=2) |" in lines  # its experiment's budget: no mark
    assert ("[^1]: AT-GRPO, shared policy: budget differs from experiment `toy/table/plan_path_at_grpo_shared`: "
            "trainer.steps=2 (experiment: 30)") in lines
    rows = {r["method"]: r for r in csv.DictReader(io.StringIO((tmp_path / "out" / "report.csv").read_text()))}
    assert rows["AT-GRPO, shared policy"]["notes"].endswith("trainer.steps=2 (experiment: 30)")
    assert rows["single agent + GRPO"]["notes"] == ""
