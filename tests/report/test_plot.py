"""Training-curve PNGs: roles from train/<role>/success, one file per run with metrics."""

from marl_cli.report import make_report
from marl_cli.report.plot import agent_roles, read_metrics, slug
from tests.report.rundirs import curve, make_run

PNG = b"\x89PNG\r\n\x1a\n"


def test_roles_exclude_policy_namespaces():
    records = curve(roles=("tool", "plan"), policy="shared")
    assert "train/shared/reward" in records[1]  # a policy trainer namespace also logs a reward
    assert agent_roles(records) == ["plan", "tool"]
    old = [{"step": 1, "train/agent/reward": 1.0, "train/shared/reward": 1.0, "train/shared/loss": 0.1}]
    assert agent_roles(old) == ["agent"]


def test_read_metrics_skips_a_truncated_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/reward": 0.5}\n{"step": 2, "train/rew')
    assert read_metrics(path) == [{"step": 1, "train/reward": 0.5}]


def test_plot_writes_one_png_per_run_with_metrics(tmp_path):
    for seed in range(2):
        make_run(tmp_path, f"runs/seed={seed}", seed=seed, workflow="tool_plan", algorithm="at_grpo",
                 report={"table": "Toy/CPU"}, metrics=curve())
    make_run(tmp_path, "runs/no_metrics")
    out = tmp_path / "out"
    report = make_report([str(tmp_path / "runs")], out, plot=True)
    pngs = sorted((out / "plots").iterdir())
    assert [p.name for p in pngs] == ["Toy_CPU__AT-GRPO_shared_policy__Plan-Path__seed0.png",
                                      "Toy_CPU__AT-GRPO_shared_policy__Plan-Path__seed1.png"]
    assert set(pngs) <= set(report.files)
    for png in pngs:
        assert png.read_bytes()[:8] == PNG
        assert png.stat().st_size > 5000


def test_slug():
    assert slug("AT-GRPO, shared policy [trainer.learning_rate=0.001]") == \
        "AT-GRPO_shared_policy_trainer.learning_rate=0.001"
    assert slug("../..") == "run"
