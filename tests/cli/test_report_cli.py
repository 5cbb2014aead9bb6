"""``marl report`` from the command line: argument translation, files, Markdown, usage errors."""

import csv

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from marl_cli.cli.report import hydra_arguments, hydra_quote, is_run_argument, split_arguments
from tests.helpers import cli
from tests.report.rundirs import curve, make_run


def test_arguments_become_runs_and_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seed=0").mkdir()
    args = hydra_arguments(*split_arguments(["a", "multirun/x/trainer.learning_rate=0.001/seed=0", "multirun/*/seed=1",
                                             "seed=0", "--plot", "metric=pass@1", "hydra.run.dir=/tmp/r", "digits=2"]))
    assert args == ["runs=['a','multirun/x/trainer.learning_rate=0.001/seed=0','multirun/*/seed=1','seed=0']",
                    "plot=true", "metric=pass@1", "hydra.run.dir=/tmp/r", "digits=2"]
    assert is_run_argument("outputs/x") and is_run_argument("x*=1") and not is_run_argument("digits=3")


@pytest.mark.parametrize("path", ["plain", "a b/c=1,2", "it's", "back\\slash'", "end\\", "${oc.env:HOME}", "x]",
                                  "a\\${b}"])
def test_quoted_paths_come_back_unchanged_through_hydra_and_omegaconf(path):
    override = OverridesParser.create().parse_override("runs=[" + hydra_quote(path) + "]")
    cfg = OmegaConf.create({"runs": override.value()})
    assert OmegaConf.to_container(cfg, resolve=True)["runs"] == [path]


def test_report_command(tmp_path):
    sweep = tmp_path / "multirun/toy/2026-01-01_00-00-00"
    for seed, success in enumerate((0.5, 0.6, 0.7)):
        make_run(sweep, f"experiment=toy/plan_path_grpo/seed={seed}", seed=seed, success=success, before=0.2,
                 report={"table": "Toy", "paper": 11, "source": "Stronger-MAS", "before_method": "single agent"},
                 metrics=curve(roles=("agent",)))
    make_run(tmp_path, "outputs/crashed/1", status=None)
    out = tmp_path / "report"
    result = cli("report", str(tmp_path / "multirun"), str(tmp_path / "outputs/*"), "--plot", "digits=1",
                  f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    stdout = result.stdout
    assert "## Toy" in stdout
    assert "| method | Plan-Path ours | Plan-Path paper | Plan-Path Δ |" in stdout
    assert "| single agent + GRPO | 60.0 ± 10.0 (n=3) | 11.0 | +49.0 |" in stdout
    assert "| single agent | 20.0 ± 0.0 (n=3) | – | – |" in stdout
    assert "Paper numbers: Stronger-MAS" in stdout
    assert f"- `{tmp_path / 'outputs/crashed/1'}`: no summary.json" in stdout
    for name in ("report.md", "report.csv", "runs.csv"):
        assert (out / name).is_file()
        assert str(out / name) in stdout
    assert stdout.index("## Toy") < stdout.index(str(out / "report.md"))
    assert (out / "report.md").read_text().strip() in stdout
    with (out / "runs.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    pngs = sorted((out / "plots").glob("*.png"))
    # one figure per cell, one per task with its methods on one axis
    assert [p.name for p in pngs] == ["Toy__Plan-Path__methods.png", "Toy__single_agent_+_GRPO__Plan-Path.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_missing_path_is_a_one_line_usage_error(tmp_path):
    result = cli("report", str(tmp_path / "nope"), f"hydra.run.dir={tmp_path / 'r'}")
    assert result.returncode == 2
    assert result.stderr.strip() == f"marl report: error: {tmp_path / 'nope'}: no such file or directory"
    assert result.stdout == ""
    assert not (tmp_path / "r").exists()  # no report dir is made for a report that cannot start


def test_no_runs_is_a_usage_error():
    result = cli("report", "metric=success")
    assert result.returncode == 2
    assert result.stderr.startswith("marl report: error: no runs given; usage: marl report")
    assert len(result.stderr.strip().splitlines()) == 1
