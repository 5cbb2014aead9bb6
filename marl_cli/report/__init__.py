"""``marl report``: run directories → tables (Markdown, CSV) side by side with paper numbers, and plots.

``runs`` finds and reads run dirs, ``table`` groups them into cells and formats them, ``plot`` draws
training curves per cell, ``compare`` the methods of each task on one axis. ``make_report`` ties them
together and writes the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from marl_cli.report.runs import ReportError, Run, load_runs
from marl_cli.report.table import Cell, build_cells, cells_csv, markdown, runs_csv

__all__ = ["Cell", "Report", "ReportError", "Run", "make_report"]


@dataclass
class Report:
    """What ``make_report`` made: the Markdown, the cells and runs behind it, and the files written."""

    markdown: str
    cells: list[Cell]
    runs: list[Run]
    files: list[Path] = field(default_factory=list)


def make_report(patterns: list[str], out_dir: Path, metric: str = "success", digits: int = 1,
                plot: bool = False) -> Report:
    """Read the runs ``patterns`` name, write report.md, report.csv, runs.csv (and plots/*.png) to ``out_dir``."""
    if not patterns:
        raise ReportError("no runs given; name run dirs, sweep dirs or globs")
    runs = load_runs(patterns, metric)
    cells = build_cells(runs)
    report = Report(markdown(cells, runs, metric, digits), cells, runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("report.md", report.markdown), ("report.csv", cells_csv(cells)),
                       ("runs.csv", runs_csv(runs))):
        (out_dir / name).write_text(text)
        report.files.append(out_dir / name)
    if plot:
        from marl_cli.report.compare import plot_tasks
        from marl_cli.report.plot import plot_runs

        report.files += plot_tasks(runs, out_dir / "plots", metric)
        report.files += plot_runs(runs, out_dir / "plots")
    return report
