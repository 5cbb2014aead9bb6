"""Methods on one axis: per task (table and benchmark), the held-out eval metric against the step, one curve
per method (table row), mean ± sample std over its seeds as a band — the figure a table cell's number comes from.

A method's points are its runs' ``eval_before/<metric>`` (step 0) and ``eval/<metric>`` records (every
``trainer.eval_every`` steps and after the last), in percent as in the table, on the steps every run of the
cell logged (``plot.cell_series``). Only cells with a result are drawn (runs without one have their own
per-run figures); a row whose budget differs from its experiment's is marked in the legend.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from marl_cli.report.plot import CellSeries, Records, cell_series, plot_groups, read_metrics, slug
from marl_cli.report.runs import Run
from marl_cli.report.table import METHOD_ORDER, build_cells

POINT = "value"


def eval_points(records: Records, metric: str = "success") -> Records:
    """One record ``{"step", "value"}`` per held-out evaluation of a run (``eval_before`` at step 0, ``eval``),
    in percent."""
    keys = (f"eval_before/{metric}", f"eval/{metric}")
    return [{"step": r["step"], POINT: 100.0 * r[k]} for r in records for k in keys
            if isinstance(r.get(k), int | float) and not isinstance(r.get(k), bool)]


def task_curves(runs: list[Run], metric: str = "success") -> dict[tuple[str, str], list[tuple[str, CellSeries]]]:
    """Per (table, benchmark): (legend label, eval curve) of each method with a result and logged evals,
    in the table's method order."""
    cells = build_cells(runs)
    noted = {(c.table, c.method, c.benchmark) for c in cells if c.notes}
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    found: dict[tuple[str, str], list[tuple[tuple[int, str], str, CellSeries]]] = {}
    for group in plot_groups(runs):
        if group.no_result:
            continue
        data = cell_series([eval_points(read_metrics(Path(r.path) / "metrics.jsonl"), metric) for r in group.runs],
                           POINT)
        if data.steps:
            mark = " (budget differs)" if (group.table, group.method, group.benchmark) in noted else ""
            base = next((c.base for c in cells if c.method == group.method), group.method)
            rank = (order.get(base, len(order)), group.method)
            found.setdefault((group.table, group.benchmark), []).append((rank, f"{group.method}{mark} (n={data.n})",
                                                                        data))
    return {task: [(label, data) for _, label, data in sorted(curves, key=lambda c: c[0])]
            for task, curves in found.items()}


def plot_task(table: str, benchmark: str, curves: list[tuple[str, CellSeries]], metric: str, path: Path) -> Path:
    """One PNG: every method's eval curve on one axis, with a ± std band where two or more seeds ran."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax: Any = fig.subplots()
    for i, (label, data) in enumerate(curves):
        color = f"C{i % 10}"
        ax.plot(data.steps, data.mean, "-o", color=color, label=label, markersize=4)
        if data.std is not None:
            ax.fill_between(data.steps, [m - s for m, s in zip(data.mean, data.std, strict=True)],
                            [m + s for m, s in zip(data.mean, data.std, strict=True)], color=color, alpha=0.18,
                            linewidth=0)
    ax.set(xlabel="RL step", ylabel=f"held-out eval/{metric} (%)", ylim=(-2, 102))
    ax.set_title(f"{benchmark} · {table}\nmean ± sample std over seeds (n = runs)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_tasks(runs: list[Run], out_dir: Path, metric: str = "success") -> list[Path]:
    """One PNG per task with a result, ``<table>__<benchmark>__methods.png``; the paths written."""
    return [plot_task(table, benchmark, curves, metric, out_dir / f"{slug(table)}__{slug(benchmark)}__methods.png")
            for (table, benchmark), curves in task_curves(runs, metric).items()]
