"""Cells (seed groups, clashing groups, starting points), Markdown with paper columns, CSV files."""

import csv
import io
import statistics

import pytest

from marl_cli.report import make_report
from marl_cli.report.runs import load_runs
from marl_cli.report.table import build_cells, cells_csv, fmt_diff, fmt_paper, markdown, runs_csv
from tests.report.rundirs import make_run

TABLE = {"table": "Toy"}


def _cells(tmp_path, *patterns):
    runs = load_runs([str(tmp_path / p) for p in (patterns or ["."])])
    return runs, {(c.table, c.method, c.benchmark): c for c in build_cells(runs)}


def _rows(md: str, title: str) -> dict[str, list[str]]:
    """The rows of the Markdown table under ``## title``, by their first cell (the header row under 'method')."""
    block = md.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("|") and not line.startswith("|---")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return {r[0]: r[1:] for r in rows}


def test_three_seeds_give_mean_and_sample_std(tmp_path):
    for seed, success in enumerate((0.50, 0.56, 0.62)):
        make_run(tmp_path, f"grpo/seed={seed}", seed=seed, success=success, report=TABLE)
    _, cells = _cells(tmp_path)
    cell = cells[("Toy", "single agent + GRPO", "Plan-Path")]
    assert cell.n == 3
    assert cell.mean == pytest.approx(56.0)
    assert cell.std == pytest.approx(statistics.stdev([50.0, 56.0, 62.0]))  # sample std: 6.0
    assert cell.std == pytest.approx(6.0)
    md = markdown(list(cells.values()), load_runs([str(tmp_path)]))
    assert _rows(md, "Toy")["single agent + GRPO"] == ["56.0 ± 6.0 (n=3)"]


def test_one_seed_shows_just_the_value(tmp_path):
    make_run(tmp_path, "r", success=0.375)
    runs, cells = _cells(tmp_path)
    md = markdown(list(cells.values()), runs, digits=2)
    assert _rows(md, "runs") == {"method": ["Plan-Path"], "single agent + GRPO": ["37.50"]}


def test_paper_columns_side_by_side_with_signed_difference(tmp_path):
    source = "Stronger-MAS (arXiv 2510.11062), Qwen3-1.7B"
    make_run(tmp_path, "a", workflow="tool_plan", algorithm="at_grpo", success=0.99,
             report={**TABLE, "paper": 97, "source": source})
    make_run(tmp_path, "b", success=0.0, report={**TABLE, "paper": 97, "source": source, "method": "x"})
    make_run(tmp_path, "c", env="sudoku", success=0.4, report=TABLE)  # no paper number for Sudoku
    runs, cells = _cells(tmp_path)
    md = markdown(list(cells.values()), runs)
    rows = _rows(md, "Toy")
    assert rows["method"] == ["Sudoku", "Plan-Path ours", "Plan-Path paper", "Plan-Path Δ"]
    assert rows["AT-GRPO, shared policy"] == ["–", "99.0", "97.0", "+2.0"]
    assert rows["x"] == ["–", "0.0", "97.0", "−97.0"]
    assert rows["single agent + GRPO"] == ["40.0", "–", "–", "–"]
    assert f"Paper numbers: {source}" in md
    assert cells[("Toy", "x", "Plan-Path")].diff == pytest.approx(-97.0)


def test_difference_and_paper_formatting():
    assert fmt_diff(2.0, 1) == "+2.0"
    assert fmt_diff(-97.0, 1) == "−97.0"
    assert fmt_diff(-0.01, 1) == "0.0"
    assert fmt_paper(15.75, 1) == "15.75"
    assert fmt_paper(99, 1) == "99.0"


def test_two_lr_groups_on_one_cell_become_two_rows(tmp_path):
    for lr, base in ((0.01, 0.3), (0.001, 0.6)):
        for seed in range(2):
            make_run(tmp_path, f"sweep/trainer.learning_rate={lr}/seed={seed}", seed=seed, lr=lr,
                     success=base + 0.02 * seed,
                     overrides=["experiment=toy/plan_path_grpo", f"trainer.learning_rate={lr}", "logger=none"])
    runs, cells = _cells(tmp_path)
    assert set(cells) == {("runs", "single agent + GRPO [trainer.learning_rate=0.001]", "Plan-Path"),
                          ("runs", "single agent + GRPO [trainer.learning_rate=0.01]", "Plan-Path")}
    assert cells[("runs", "single agent + GRPO [trainer.learning_rate=0.01]", "Plan-Path")].mean == pytest.approx(31)
    rows = _rows(markdown(list(cells.values()), runs), "runs")
    assert list(rows) == ["method", "single agent + GRPO [trainer.learning_rate=0.001]",
                          "single agent + GRPO [trainer.learning_rate=0.01]"]


def test_clashing_groups_without_telling_overrides_use_config_values(tmp_path):
    make_run(tmp_path, "a", lr=0.1, success=0.2)
    make_run(tmp_path, "b", lr=0.2, success=0.4)
    _, cells = _cells(tmp_path)
    assert {m for _, m, _ in cells} == {"single agent + GRPO [trainer.learning_rate=0.1]",
                                        "single agent + GRPO [trainer.learning_rate=0.2]"}


def test_before_method_rows_count_each_starting_point_once(tmp_path):
    # an lr sweep of GRPO (2 lrs × 3 seeds) and AT-GRPO (3 seeds): starting points are per seed, not per lr
    for lr in (0.01, 0.001):
        for seed in range(3):
            make_run(tmp_path, f"grpo/lr={lr}/seed={seed}", seed=seed, lr=lr, success=0.5, before=0.1 * (seed + 1),
                     overrides=[f"trainer.learning_rate={lr}"],
                     report={**TABLE, "method": "single agent + GRPO", "before_method": "single agent"})
    for seed in range(3):
        make_run(tmp_path, f"at/seed={seed}", seed=seed, workflow="tool_plan", algorithm="at_grpo", success=0.9,
                 before=0.3, report={**TABLE, "before_method": "MAS, prompt only"})
    runs, cells = _cells(tmp_path)
    single = cells[("Toy", "single agent", "Plan-Path")]
    assert single.n == 3
    assert single.values == pytest.approx([10.0, 20.0, 30.0])
    assert cells[("Toy", "MAS, prompt only", "Plan-Path")].values == pytest.approx([30.0] * 3)
    rows = _rows(markdown(list(cells.values()), runs), "Toy")
    assert list(rows)[1:] == ["single agent", "single agent + GRPO [trainer.learning_rate=0.001]",
                              "single agent + GRPO [trainer.learning_rate=0.01]", "MAS, prompt only",
                              "AT-GRPO, shared policy"]
    assert rows["single agent"] == ["20.0 ± 10.0 (n=3)"]
    assert rows["MAS, prompt only"] == ["30.0 ± 0.0 (n=3)"]


def test_runs_without_a_result_are_listed_with_reasons(tmp_path):
    make_run(tmp_path, "ok", success=0.5)
    crashed = make_run(tmp_path, "crashed", status=None)
    failed = make_run(tmp_path, "failed", status="failed", success=None, summary={"error": "ValueError: bad"})
    runs, cells = _cells(tmp_path)
    md = markdown(list(cells.values()), runs)
    section = md.split("## Runs without a result\n\n", 1)[1]
    assert f"- `{crashed}`: no summary.json" in section
    assert f"- `{failed}`: status failed: ValueError: bad" in section
    assert "`" + str(tmp_path / "ok") + "`" not in section
    assert "3 runs, 1 with a result" in md


def test_a_paper_cell_without_our_result_still_shows_the_paper_number(tmp_path):
    make_run(tmp_path, "failed", status="failed", success=None, report={**TABLE, "paper": 96, "source": "P"})
    runs, cells = _cells(tmp_path)
    assert _rows(markdown(list(cells.values()), runs), "Toy")["single agent + GRPO"] == ["–", "96.0", "–"]


def test_one_table_per_report_table(tmp_path):
    make_run(tmp_path, "a", report={"table": "First"})
    make_run(tmp_path, "b", env="sokoban", report={"table": "Second"})
    runs, cells = _cells(tmp_path)
    md = markdown(list(cells.values()), runs)
    assert md.index("## First") < md.index("## Second")
    assert _rows(md, "Second")["method"] == ["Sokoban"]


def test_csv_files(tmp_path):
    for seed, success in enumerate((0.5, 0.6, 0.7)):
        make_run(tmp_path, f"runs/seed={seed}", seed=seed, success=success, before=0.1,
                 report={**TABLE, "paper": 11, "source": "P", "before_method": "single agent"})
    make_run(tmp_path, "runs/broken", status=None)
    runs, cells = _cells(tmp_path)
    rows = list(csv.DictReader(io.StringIO(cells_csv(list(cells.values())))))
    by_method = {r["method"]: r for r in rows}
    trained = by_method["single agent + GRPO"]
    assert trained["table"] == "Toy" and trained["benchmark"] == "Plan-Path"
    assert float(trained["ours_mean"]) == pytest.approx(60.0)
    assert float(trained["ours_std"]) == pytest.approx(10.0)
    assert trained["n"] == "3"
    assert float(trained["paper"]) == 11.0 and float(trained["diff"]) == pytest.approx(49.0)
    assert trained["source"] == "P"
    assert trained["runs"].split(";") == [str(tmp_path / f"runs/seed={s}") for s in range(3)]
    assert float(by_method["single agent"]["ours_mean"]) == pytest.approx(10.0)
    assert by_method["single agent"]["paper"] == ""

    run_rows = list(csv.DictReader(io.StringIO(runs_csv(runs))))
    assert [r["run_dir"] for r in run_rows] == [str(tmp_path / p) for p in
                                                ("runs/broken", "runs/seed=0", "runs/seed=1", "runs/seed=2")]
    assert run_rows[0]["status"] == "missing" and run_rows[0]["reason"] == "no summary.json"
    assert run_rows[0]["value"] == ""
    assert run_rows[2] == {"run_dir": str(tmp_path / "runs/seed=1"), "status": "completed", "table": "Toy",
                           "method": "single agent + GRPO", "benchmark": "Plan-Path", "seed": "1", "value": "60.0",
                           "reason": ""}


def test_make_report_writes_the_files(tmp_path):
    make_run(tmp_path, "runs/a", success=0.5)
    out = tmp_path / "out"
    report = make_report([str(tmp_path / "runs")], out)
    assert report.files == [out / "report.md", out / "report.csv", out / "runs.csv"]
    assert (out / "report.md").read_text() == report.markdown
    assert "| single agent + GRPO | 50.0 |" in report.markdown
    assert len((out / "runs.csv").read_text().splitlines()) == 2


def test_an_eval_of_a_run_filed_in_its_cell_gets_its_own_row(tmp_path):
    report = {**TABLE, "method": "AT-GRPO, shared policy"}
    trained = [make_run(tmp_path, f"train/seed={s}", seed=s, success=0.8, report=report) for s in range(2)]
    for s, run in enumerate(trained):
        make_run(tmp_path, f"eval/seed={s}", seed=s, success=0.7, report=report, summary={"command": "eval"},
                 overrides=[f"load={run}"], config={"load": str(run), "eval": {"samples": 1}})
    _, cells = _cells(tmp_path)
    assert cells[("Toy", "AT-GRPO, shared policy", "Plan-Path")].values == pytest.approx([80.0, 80.0])
    evals = cells[("Toy", "AT-GRPO, shared policy [eval]", "Plan-Path")]  # the two seeds' evals: one group
    assert evals.values == pytest.approx([70.0, 70.0])
