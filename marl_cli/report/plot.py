"""Training curves as PNG files: one figure per table cell, mean ± std over its seeds (``metrics.jsonl``).

A figure's runs are the runs of one table cell (``table.build_cells``: same table, method and benchmark,
setups differing only in the seed); runs with metrics but no result yet (running, failed) get a figure
per setup of their own, marked "no result", so a crashed seed does not cut its cell's curves short.

Each curve is the mean over the cell's runs at every step, with a band of ± the sample standard deviation
(as in the table) where at least two runs have the key. Runs are aligned on the steps that every run
holding the key has logged (no interpolation): seeds of one setup log the same steps, and a shorter run
shortens the curve rather than bending it. Within a run the last value logged for a key at a step wins
(a resumed run re-logs steps; the final eval is a record of its own at the last train step).

Panels, each left out when no run has its data: reward per agent (``train/<agent>/reward``), success
per agent (``train/<agent>/success``, with ``eval_before/success`` and ``eval/success`` as mean ± std
markers), KL (``train/<policy>/kl_ref``, ``train/<policy>/kl_old`` dashed), entropy
(``train/<policy>/entropy``), clip fraction (``train/<policy>/clip_ratio/region_mean``), completion
length per agent (``train/<agent>/completion_tokens``, ``.../completion_tokens_max`` dashed) and the
sampler-vs-learner log-prob gap (``train/<policy>/logprob_gap/mean``, log scale when positive), format failures per
agent (``train/<agent>/format_failure``: a game's illegal moves) and, for games, the exact exploitability
(``eval_before/nash_conv``, ``eval/nash_conv``) and each seat's win rate in self-play (``eval/<seat>/win``) and
against each bot (``eval/vs_<bot>/<seat>/win``, dashed).

Agents are the ``x`` of ``train/<x>/success`` keys (a policy trainer's namespace ``train/<policy>/...``
may also log a ``reward``, never a ``success``); policies are the ``x`` of ``train/<x>/loss`` keys.
matplotlib is imported only here, with the Agg canvas.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_cli.report.runs import Run, metrics_records
from marl_cli.report.table import build_cells

ROLE_KEY = re.compile(r"^train/([^/]+)/success$")
POLICY_KEY = re.compile(r"^train/([^/]+)/loss$")
REWARD_KEY = re.compile(r"^train/([^/]+)/reward$")
VERSUS_KEY = re.compile(r"^eval/vs_([^/]+)/[^/]+/win$")

Records = list[dict[str, Any]]


def read_metrics(path: Path) -> Records:
    """The records of a ``metrics.jsonl``; unreadable lines (a crash mid-write) are skipped."""
    return list(metrics_records(path.read_text(errors="replace").splitlines()))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _keys(records: Records) -> set[str]:
    return {k for r in records for k in r}


def agent_roles(records: Records) -> list[str]:
    """Roles with ``train/<role>/success``; for older files, ``train/<x>/reward`` minus policy namespaces."""
    keys = _keys(records)
    roles = sorted({m.group(1) for k in keys if (m := ROLE_KEY.match(k))})
    if roles:
        return roles
    return sorted({m.group(1) for k in keys if (m := REWARD_KEY.match(k))} - set(policy_names(records)))


def policy_names(records: Records) -> list[str]:
    """Policies: the ``x`` of ``train/<x>/loss`` keys."""
    return sorted({m.group(1) for k in _keys(records) if (m := POLICY_KEY.match(k))})


def series(records: Records, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one run's numbers under ``key``, by step; the last value logged at a step wins."""
    by_step: dict[float, float] = {}
    for record in records:
        value, step = _number(record.get(key)), _number(record.get("step"))
        if value is not None and step is not None:
            by_step[step] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


@dataclass
class CellSeries:
    """One key over a cell's runs: the mean at each step and the sample std (None below two runs)."""

    steps: list[float]
    mean: list[float]
    std: list[float] | None
    n: int  # runs holding the key


def cell_series(runs: list[Records], key: str) -> CellSeries:
    """``key`` over the runs (each a run's records) that hold it, on the steps every one of them logged."""
    per_run = [s for s in (dict(zip(*series(records, key), strict=True)) for records in runs) if s]
    if not per_run:
        return CellSeries([], [], None, 0)
    steps = sorted(set.intersection(*(set(s) for s in per_run)))
    mean = [statistics.fmean(s[step] for s in per_run) for step in steps]
    std = [statistics.stdev(s[step] for s in per_run) for step in steps] if len(per_run) > 1 else None
    return CellSeries(steps, mean, std, len(per_run))


@dataclass
class Curve:
    """One plotted series: ``style`` is line, dashed, markers (mean ± std error bars) or open (hollow markers)."""

    label: str
    key: str
    data: CellSeries
    color: str | None = None  # an agent or policy name (one colour per name across panels); None: black
    style: str = "line"


@dataclass
class Panel:
    title: str
    ylabel: str
    curves: list[Curve] = field(default_factory=list)
    ylim: tuple[float, float] | None = None
    log: bool = False


def cell_panels(runs: list[Records]) -> list[Panel]:
    """The panels with data for a cell's runs (each a run's records), in drawing order."""
    records = [r for run in runs for r in run]
    agents, policies = agent_roles(records), policy_names(records)

    def curves(specs: list[tuple[str, str, str | None, str]]) -> list[Curve]:
        out = [Curve(label, key, cell_series(runs, key), color, style) for label, key, color, style in specs]
        return [c for c in out if c.data.steps]

    success = curves([(a, f"train/{a}/success", a, "line") for a in agents])
    if not success:  # older files log only the episode's success
        success = curves([("episode (train)", "train/success", None, "line")])
    success += curves([("eval before RL", "eval_before/success", None, "open"),
                       ("eval (held out)", "eval/success", None, "markers")])
    gap = curves([(p, f"train/{p}/logprob_gap/mean", p, "line") for p in policies])
    versus = sorted({m.group(1) for k in _keys(records) if (m := VERSUS_KEY.match(k))})
    wins = curves([spec for a in agents for spec in ((f"{a} (self-play)", f"eval/{a}/win", a, "markers"),
                                                     *((f"{a} vs {bot}", f"eval/vs_{bot}/{a}/win", a, "dashed")
                                                       for bot in versus))])
    panels = [
        Panel("reward per agent", "train reward", curves([(a, f"train/{a}/reward", a, "line") for a in agents])),
        Panel("success per agent", "success", success, ylim=(-0.02, 1.02)),
        Panel("KL per policy", "approx. KL", curves(
            [spec for p in policies for spec in ((f"{p} to ref", f"train/{p}/kl_ref", p, "line"),
                                                 (f"{p} to old", f"train/{p}/kl_old", p, "dashed"))])),
        Panel("entropy per policy", "entropy", curves([(p, f"train/{p}/entropy", p, "line") for p in policies])),
        Panel("clip fraction per policy", "clip ratio (region mean)",
              curves([(p, f"train/{p}/clip_ratio/region_mean", p, "line") for p in policies])),
        Panel("completion length per agent", "tokens", curves(
            [spec for a in agents for spec in ((a, f"train/{a}/completion_tokens", a, "line"),
                                               (f"{a} max", f"train/{a}/completion_tokens_max", a, "dashed"))])),
        Panel("sampler vs learner log-prob gap", "mean |Δ log p|", gap,
              log=bool(gap) and all(v > 0 for c in gap for v in c.data.mean)),
        Panel("format failures per agent", "share of turns (games: illegal moves)", curves(
            [(a, f"train/{a}/format_failure", a, "line") for a in agents]), ylim=(-0.02, 1.02)),
        Panel("exploitability (games)", "NashConv", curves([("eval before RL", "eval_before/nash_conv", None, "open"),
                                                             ("eval", "eval/nash_conv", None, "markers")])),
        Panel("wins per seat (games)", "win rate", wins, ylim=(-0.02, 1.02)),
    ]
    return [p for p in panels if p.curves]


def plot_cell(runs: list[Records], title: str, path: Path) -> Path | None:
    """Write one PNG with a grid of ``cell_panels``; None (nothing written) when no panel has data."""
    panels = cell_panels(runs)
    if not panels:
        return None
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # Hydra's root logger would show font-cache notes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = min(len(panels), 2 if len(panels) <= 4 else 3)
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.5 * ncols, 3.6 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    names = sorted({c.color for p in panels for c in p.curves if c.color is not None})
    palette = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for ax, panel in zip(axes, panels, strict=False):
        for curve in panel.curves:
            _draw(ax, curve, palette.get(curve.color or "", "black"))
        ax.set(title=panel.title, xlabel="step", ylabel=panel.ylabel)
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        if panel.log:
            ax.set_yscale("log")
            if any(c.data.std and any(m <= s for m, s in zip(c.data.mean, c.data.std, strict=True))
                   for c in panel.curves):  # a band reaching 0 runs off the bottom instead of setting it
                ax.set_ylim(bottom=min(m for c in panel.curves for m in c.data.mean) / 3)
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _draw(ax: Any, curve: Curve, color: str) -> None:
    data = curve.data
    label = curve.label + (f" (n={data.n})" if curve.style in ("markers", "open") and data.n > 1 else "")
    if curve.style in ("markers", "open"):
        ax.errorbar(data.steps, data.mean, yerr=data.std, fmt="o", color=color, capsize=3, label=label,
                    markerfacecolor="white" if curve.style == "open" else color, zorder=3)
        return
    ax.plot(data.steps, data.mean, "--" if curve.style == "dashed" else "-", color=color, label=label,
            marker="o" if len(data.steps) == 1 else None)
    if data.std is not None:
        low = [m - s for m, s in zip(data.mean, data.std, strict=True)]
        high = [m + s for m, s in zip(data.mean, data.std, strict=True)]
        ax.fill_between(data.steps, low, high, color=color, alpha=0.12 if curve.style == "dashed" else 0.2,
                        linewidth=0)


def slug(text: str) -> str:
    """A file-name-safe form of ``text``."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_.") or "run"


def plot_file_name(table: str, method: str, benchmark: str, no_result: bool = False) -> str:
    """``<table>__<method>__<benchmark>`` (slugged), ``__no_result`` for runs the table does not count."""
    return "__".join(slug(p) for p in (table, method, benchmark, *(("no_result",) if no_result else ())))


@dataclass
class PlotGroup:
    """The runs of one figure: a table cell's runs, or runs of one setup without a result (``no_result``)."""

    table: str
    method: str
    benchmark: str
    runs: list[Run]
    no_result: bool = False

    @property
    def title(self) -> str:
        n = len(self.runs)
        seeds = ", ".join(str(r.seed) for r in self.runs if r.seed is not None)
        statuses = ", ".join(dict.fromkeys(r.status for r in self.runs))
        line = f"{self.method} · {self.benchmark} · {n} seed{'s' if n != 1 else ''}"
        detail = [f"table {self.table}", *([f"seed {seeds}" if n == 1 else f"seeds {seeds}"] if seeds else []),
                  *([f"no result ({statuses})"] if self.no_result else [])]
        return line + "\n" + "; ".join(detail)


def plot_groups(runs: list[Run]) -> list[PlotGroup]:
    """The figures' runs (those with a ``metrics.jsonl``): one group per cell of ``build_cells``, in its order.

    A run files its starting point (``eval_before``) under another row too; its curves stay with its own cell.
    Runs with metrics in no cell (no result yet) are grouped by setup (table, method, benchmark, setup key).
    """
    by_path = {r.path: r for r in runs}
    placed: set[str] = set()
    groups: list[PlotGroup] = []
    for cell in build_cells(runs):
        members = [by_path[p] for p in cell.runs
                   if p in by_path and p not in placed and by_path[p].method == cell.base and by_path[p].has_metrics]
        placed.update(r.path for r in members)
        if members:
            groups.append(PlotGroup(cell.table, cell.method, cell.benchmark, members))
    rest: dict[tuple[str, str, str, str], PlotGroup] = {}
    for run in runs:
        if run.has_metrics and run.path not in placed:
            key = (run.table, run.method, run.benchmark, f"{run.command}:{run.key}")
            rest.setdefault(key, PlotGroup(run.table, run.method, run.benchmark, [], no_result=True)).runs.append(run)
    return groups + list(rest.values())


def plot_runs(runs: list[Run], out_dir: Path) -> list[Path]:
    """One PNG per ``plot_groups`` group with metrics, ``<table>__<method>__<benchmark>.png``; the paths written."""
    written: list[Path] = []
    used: set[str] = set()
    for group in plot_groups(runs):
        pairs = [(run, read_metrics(Path(run.path) / "metrics.jsonl")) for run in group.runs]
        pairs = [(run, records) for run, records in pairs if records]
        if not pairs:
            continue
        group.runs = [run for run, _ in pairs]
        base = plot_file_name(group.table, group.method, group.benchmark, group.no_result)
        name, i = base, 1
        while name in used:
            i += 1
            name = f"{base}_{i}"
        path = plot_cell([records for _, records in pairs], group.title, out_dir / f"{name}.png")
        if path is not None:
            used.add(name)
            written.append(path)
    return written
