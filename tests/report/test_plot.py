"""Training-curve PNGs: one figure per table cell, mean ± std over seeds aligned on the step."""

import pytest

from marl_cli.report import make_report
from marl_cli.report.plot import (
    agent_roles,
    cell_panels,
    cell_series,
    plot_groups,
    policy_names,
    read_metrics,
    series,
    slug,
)
from marl_cli.report.runs import load_runs
from tests.report.rundirs import curve, make_run

PNG = b"\x89PNG\r\n\x1a\n"


def rich_curve(seed: int, steps: int = 4) -> list[dict]:
    """``curve`` plus the policy trainer's diagnostics and completion lengths, shifted by the seed."""
    records = curve(steps=steps, roles=("tool", "plan"), policy="shared")
    for record in records:
        if "train/shared/loss" in record:
            record.update({"train/shared/kl_ref": 0.01 * record["step"] + 0.001 * seed,
                           "train/shared/kl_old": 0.002, "train/shared/entropy": 1.0 - 0.1 * record["step"],
                           "train/shared/clip_ratio/region_mean": 0.05 + 0.01 * seed,
                           "train/shared/logprob_gap/mean": 0.01 * (seed + 1),
                           "train/tool/completion_tokens": 100.0 + seed, "train/tool/completion_tokens_max": 200.0,
                           "train/plan/completion_tokens": 50.0 + seed})
            record["train/tool/reward"] += 0.1 * seed
    return records


def test_roles_exclude_policy_namespaces():
    records = curve(roles=("tool", "plan"), policy="shared")
    assert "train/shared/reward" in records[1]  # a policy trainer namespace also logs a reward
    assert agent_roles(records) == ["plan", "tool"]
    assert policy_names(records) == ["shared"]
    old = [{"step": 1, "train/agent/reward": 1.0, "train/shared/reward": 1.0, "train/shared/loss": 0.1}]
    assert agent_roles(old) == ["agent"]


def test_read_metrics_skips_a_truncated_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/reward": 0.5}\n{"step": 2, "train/rew\nnot json\n[1]\n{"no": "step"}\n')
    assert read_metrics(path) == [{"step": 1, "train/reward": 0.5}]


def test_series_keeps_the_last_value_logged_at_a_step():
    records = [{"step": 1, "k": 1.0}, {"step": 2, "k": 2.0}, {"step": 3, "k": 3.0},
               {"step": 2, "k": 20.0}, {"step": 3, "k": 30.0},  # resumed from step 1: steps 2, 3 logged again
               {"step": 3, "eval/success": 0.5},  # the final eval: its own record at the last step
               {"step": 4, "k": True}, {"step": 5, "k": float("nan")}, {"step": 6, "k": "x"}]
    assert series(records, "k") == ([1.0, 2.0, 3.0], [1.0, 20.0, 30.0])
    assert series(records, "eval/success") == ([3.0], [0.5])


def test_cell_series_mean_and_sample_std_on_common_steps():
    runs = [[{"step": s, "k": v} for s, v in ((0, 1.0), (1, 2.0), (2, 3.0))],
            [{"step": s, "k": v} for s, v in ((0, 3.0), (1, 4.0), (2, 5.0), (3, 9.0))],  # step 3: only this run
            [{"step": 0, "k": 2.0}, {"step": 1, "k": 0.0}, {"step": 2, "k": 7.0}, {"step": 2, "k": 4.0}],
            [{"step": 0, "other": 1.0}]]  # no "k": not counted
    data = cell_series(runs, "k")
    assert data.n == 3
    assert data.steps == [0.0, 1.0, 2.0]
    assert data.mean == pytest.approx([2.0, 2.0, 4.0])  # step 2 of run 3: its last value (4.0), not 7.0
    assert data.std == pytest.approx([1.0, 2.0, 1.0])


def test_cell_series_of_one_run_has_no_std_and_of_none_is_empty():
    one = cell_series([[{"step": 1, "k": 0.5}, {"step": 1, "k": 0.7}, {"step": 2, "k": 0.9}]], "k")
    assert (one.steps, one.mean, one.std, one.n) == ([1.0, 2.0], pytest.approx([0.7, 0.9]), None, 1)
    none = cell_series([[{"step": 1, "x": 1.0}]], "k")
    assert (none.steps, none.mean, none.std, none.n) == ([], [], None, 0)


def test_cell_panels_skip_panels_without_data():
    rich = {p.title: p for p in cell_panels([rich_curve(0), rich_curve(1)])}
    assert list(rich) == ["reward per agent", "success per agent", "KL per policy", "entropy per policy",
                          "clip fraction per policy", "completion length per agent",
                          "sampler vs learner log-prob gap"]
    assert [c.key for c in rich["success per agent"].curves] == [
        "train/plan/success", "train/tool/success", "eval_before/success", "eval/success"]
    assert [c.key for c in rich["KL per policy"].curves] == ["train/shared/kl_ref", "train/shared/kl_old"]
    assert [(c.key, c.style) for c in rich["completion length per agent"].curves] == [
        ("train/plan/completion_tokens", "line"), ("train/tool/completion_tokens", "line"),
        ("train/tool/completion_tokens_max", "dashed")]
    assert rich["sampler vs learner log-prob gap"].log
    tool = next(c for c in rich["reward per agent"].curves if c.label == "tool")
    assert tool.data.mean == pytest.approx([0.15, 0.25, 0.35, 0.45])
    assert tool.data.std == pytest.approx([0.1 / 2 ** 0.5] * 4)
    plain = [p.title for p in cell_panels([curve()])]
    assert plain == ["reward per agent", "success per agent"]
    old = cell_panels([[{"step": 1, "train/success": 0.5, "train/agent/reward": 1.0}]])
    assert [c.key for c in old[1].curves] == ["train/success"]  # older files: the episode's success


def test_plot_writes_one_png_per_cell(tmp_path):
    for seed in range(3):
        make_run(tmp_path, f"runs/a/seed={seed}", seed=seed, workflow="tool_plan", algorithm="at_grpo",
                 report={"table": "Toy/CPU", "before_method": "MAS, prompt only"}, before=0.2,
                 metrics=rich_curve(seed))
    make_run(tmp_path, "runs/b/seed=0", workflow="tool_plan", algorithm="at_grpo", policy="per_role",
             report={"table": "Toy/CPU"}, metrics=curve())
    make_run(tmp_path, "runs/no_metrics")
    out = tmp_path / "out"
    report = make_report([str(tmp_path / "runs")], out, plot=True)
    pngs = sorted((out / "plots").iterdir())
    assert [p.name for p in pngs] == ["Toy_CPU__AT-GRPO_per-role_policies__Plan-Path.png",
                                      "Toy_CPU__AT-GRPO_shared_policy__Plan-Path.png",
                                      "Toy_CPU__Plan-Path__methods.png"]  # and the task's methods on one axis
    assert set(pngs) <= set(report.files)
    for png in pngs:
        assert png.read_bytes()[:8] == PNG
        assert png.stat().st_size > 5000


def test_plot_groups_follow_the_table_cells(tmp_path):
    for seed in range(2):
        make_run(tmp_path, f"runs/a/seed={seed}", seed=seed, report={"table": "T", "before_method": "single agent"},
                 before=0.1, metrics=curve(roles=("agent",)))
    make_run(tmp_path, "runs/a/seed=2", seed=2, report={"table": "T"}, status="running", success=None,
             metrics=curve(roles=("agent",)))
    make_run(tmp_path, "runs/lr/seed=0", lr=1e-3, overrides=["trainer.learning_rate=0.001"],
             report={"table": "T"}, metrics=curve(roles=("agent",)))
    groups = plot_groups(load_runs([str(tmp_path / "runs")]))
    # the starting-point row (single agent) draws no figure of its own; the running seed is set apart
    assert [(g.method, len(g.runs), g.no_result) for g in groups] == [
        ("single agent + GRPO", 2, False), ("single agent + GRPO [trainer.learning_rate=0.001]", 1, False),
        ("single agent + GRPO", 1, True)]
    assert groups[0].title == "single agent + GRPO · Plan-Path · 2 seeds\ntable T; seeds 0, 1"
    assert groups[-1].title.endswith("1 seed\ntable T; seed 2; no result (running)")
    paths = make_report([str(tmp_path / "runs")], tmp_path / "out", plot=True).files
    assert sum(p.suffix == ".png" for p in paths) == 4  # 3 cells' figures and the task's methods figure
    assert any(p.name == "T__single_agent_+_GRPO__Plan-Path__no_result.png" for p in paths)


def test_slug():
    assert slug("AT-GRPO, shared policy [trainer.learning_rate=0.001]") == \
        "AT-GRPO_shared_policy_trainer.learning_rate=0.001"
    assert slug("../..") == "run"


def test_a_game_run_adds_illegal_moves_exploitability_and_wins_per_seat():
    records = [{"step": 0, "eval_before/nash_conv": 0.9, "train/player_0/success": 0.0},
               {"step": 1, "train/player_0/success": 0.5, "train/player_0/format_failure": 0.3},
               {"step": 2, "eval/nash_conv": 0.4, "eval/player_0/win": 0.5, "eval/vs_mcts/player_0/win": 0.1,
                "train/player_0/success": 0.5}]
    panels = {p.title: p for p in cell_panels([records])}
    assert [c.key for c in panels["exploitability (games)"].curves] == ["eval_before/nash_conv", "eval/nash_conv"]
    assert [(c.key, c.style) for c in panels["wins per seat (games)"].curves] == [
        ("eval/player_0/win", "markers"), ("eval/vs_mcts/player_0/win", "dashed")]
    assert [c.key for c in panels["format failures per agent"].curves] == ["train/player_0/format_failure"]
