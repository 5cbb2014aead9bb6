"""From runs to cells (seed groups, mean ± std) and from cells to Markdown and CSV.

A cell is one (table, method, benchmark). Runs whose setups differ only in the seed form one group, and
its values one cell. Two different groups landing on one cell become two rows, each label suffixed with
what tells them apart (the overrides, else the config values). A run whose ``report.before_method`` is
set also files its starting point (``eval_before``) as a cell of that row; runs starting from the same
model with the same seed count once there (an lr sweep has one starting point per seed). A row whose runs
changed their experiment's budget (``report.budget``) gets a footnote saying how.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from marl_cli.report.runs import BEFORE_IGNORED, BOOKKEEPING, NUMBER, Run, is_bookkeeping, leaves, scale

METHOD_ORDER = ("single agent", "single agent + GRPO", "MAS, prompt only", "MAS + GRPO", "AT-GRPO, shared policy",
                "AT-GRPO, per-role policies", "AT-GRPO, LoRA per role", "M-GRPO, frozen sub", "M-GRPO")
BENCHMARK_ORDER = ("Sudoku", "Sokoban", "Plan-Path", "LiveCodeBench", "APPS", "CodeContests", "AIME24", "AIME25",
                   "OlympiadBench", "GAIA", "XBench-DeepSearch", "WebWalkerQA", "Code (embedded)",
                   "Math (embedded)", "Research (embedded)")
KIND_MARKS = {"train": "", "eval": "eval", "before": "start of training"}
EMPTY = "–"
MINUS = "−"


@dataclass
class Cell:
    """One table cell: our values (percent, one per seed), the runs they came from, and the paper's number."""

    table: str
    method: str
    benchmark: str
    values: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    paper: float | None = None
    source: str | None = None
    base: str = ""  # the method before a suffix telling clashing groups apart
    notes: list[str] = field(default_factory=list)  # e.g. how its runs' budget differs from their experiment's

    def __post_init__(self) -> None:
        self.base = self.base or self.method

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """Sample standard deviation; None below two values."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    @property
    def diff(self) -> float | None:
        return None if self.mean is None or self.paper is None else self.mean - self.paper


@dataclass
class _Group:
    table: str
    method: str
    benchmark: str
    kind: str  # train | eval | before (a run's starting point)
    config: dict[str, Any]
    overrides: list[str]
    values: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    seeds: set[int] = field(default_factory=set)
    paper: float | None = None
    source: str | None = None
    notes: list[str] = field(default_factory=list)


def budget_note(run: Run) -> list[str]:
    """The footnote of a run whose budget is not its experiment's (none otherwise)."""
    if not run.budget:
        return []
    return [f"budget differs from experiment `{run.experiment}`: {', '.join(run.budget)}"]


def _groups(runs: list[Run]) -> list[_Group]:
    groups: dict[tuple[str, str, str, str], _Group] = {}

    def add(run: Run, method: str, key: str, value: float | None, kind: str) -> None:
        overrides = [o for o in run.overrides if not is_bookkeeping(o)]
        group = groups.get((run.table, method, run.benchmark, key))
        if group is None:
            group = groups[(run.table, method, run.benchmark, key)] = _Group(
                run.table, method, run.benchmark, kind, run.config, overrides)
        else:
            group.overrides = [o for o in group.overrides if o in overrides]
        if kind != "before" and group.paper is None and run.paper is not None:
            group.paper, group.source = run.paper, run.source
        if kind != "before":
            group.notes = list(dict.fromkeys([*group.notes, *budget_note(run)]))
        if value is None or (kind == "before" and run.seed is not None and run.seed in group.seeds):
            return
        if run.seed is not None:
            group.seeds.add(run.seed)
        group.values.append(value)
        group.runs.append(run.path)

    for run in runs:
        add(run, run.method, f"{run.command}:{run.key}", run.value, "eval" if run.command == "eval" else "train")
    for run in runs:
        if run.before_method and run.before is not None:
            add(run, run.before_method, "before:" + run.before_key, run.before, "before")
    return list(groups.values())


def _flat(config: Any) -> dict[str, str]:
    """Every leaf of ``config`` by dotted key, as text (empty mappings left out)."""
    return {key: value if isinstance(value, str) else json.dumps(value, default=str)
            for key, value in leaves(config) if value != {}}


def _config_diffs(groups: list[_Group]) -> list[str]:
    flats = []
    for g in groups:
        ignored = (*BOOKKEEPING, *(BEFORE_IGNORED if g.kind == "before" else ()))
        flats.append({k: v for k, v in _flat(g.config).items()
                      if not any(k == i or k.startswith(i + ".") for i in ignored)})
    keys = sorted({k for f in flats for k in f if len({f.get(k) for f in flats}) > 1})
    labels = []
    for f in flats:
        parts = [f"{k}={f.get(k, 'unset')}" for k in keys]
        labels.append(", ".join(parts[:3]) + (", …" if len(parts) > 3 else ""))
    return labels


def _suffixes(groups: list[_Group]) -> list[str]:
    """What tells groups of one cell apart: their overrides not shared by all, else their config values."""
    common = set.intersection(*(set(g.overrides) for g in groups))
    labels = [", ".join(o for o in g.overrides if o not in common) for g in groups]
    if len({g.kind for g in groups}) > 1:  # e.g. a run's final eval beside another's starting point
        labels = [", ".join(p for p in (KIND_MARKS[g.kind], lab) if p) for g, lab in zip(groups, labels, strict=True)]
    if len(set(labels)) < len(labels):
        labels = _config_diffs(groups)
    if len(set(labels)) < len(labels):
        labels = [", ".join(p for p in (lab, f"#{i + 1}") if p) for i, lab in enumerate(labels)]
    return labels


def build_cells(runs: list[Run]) -> list[Cell]:
    """The table cells of ``runs``: one per (table, method, benchmark), or one per group where groups clash."""
    by_cell: dict[tuple[str, str, str], list[_Group]] = {}
    for group in _groups(runs):
        by_cell.setdefault((group.table, group.method, group.benchmark), []).append(group)
    cells: list[Cell] = []
    for (table, method, benchmark), groups in by_cell.items():
        paper = next((g for g in groups if g.paper is not None), None)
        valued = [g for g in groups if g.values]
        if len(valued) <= 1:
            if valued or paper is not None:
                g = valued[0] if valued else None
                cells.append(Cell(table, method, benchmark, list(g.values) if g else [], list(g.runs) if g else [],
                                  paper.paper if paper else None, paper.source if paper else None,
                                  notes=list(g.notes) if g else []))
            continue
        for g, suffix in zip(valued, _suffixes(valued), strict=True):
            own = g if g.paper is not None else paper
            cells.append(Cell(table, f"{method} [{suffix}]" if suffix else method, benchmark, list(g.values),
                              list(g.runs), own.paper if own else None, own.source if own else None, method,
                              list(g.notes)))
    return cells


# ---------------------------------------------------------------- formatting

def fmt(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt_paper(value: float, digits: int) -> str:
    """The paper's number with ``digits`` decimals, or more when it has them (15.75 stays 15.75)."""
    for d in range(digits, digits + 3):
        if math.isclose(float(f"{value:.{d}f}"), value, abs_tol=1e-9):
            return fmt(value, d)
    return fmt(value, digits + 2)


def fmt_diff(value: float, digits: int) -> str:
    text = fmt(abs(value), digits)
    if float(text) == 0:
        return text
    return ("+" if value > 0 else MINUS) + text


def fmt_ours(cell: Cell, digits: int) -> str:
    if cell.mean is None:
        return EMPTY
    if cell.std is None:
        return fmt(cell.mean, digits)
    return f"{fmt(cell.mean, digits)} ± {fmt(cell.std, digits)} (n={cell.n})"


def _ordered(items: list[str], order: tuple[str, ...]) -> list[str]:
    first = list(dict.fromkeys(items))
    return sorted(first, key=lambda x: (order.index(x), "") if x in order else (len(order) + first.index(x), x))


def _row_order(cells: list[Cell]) -> list[str]:
    bases = {c.method: c.base for c in cells}
    base_order = _ordered(list(bases.values()), METHOD_ORDER)
    return sorted(bases, key=lambda m: (base_order.index(bases[m]), m != bases[m],
                                        [float(t) if i % 2 else t for i, t in enumerate(NUMBER.split(m))], m))


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(cells: list[Cell], digits: int = 1, markers: dict[str, str] | None = None) -> str:
    """One Markdown table (rows = methods, columns = benchmarks, paper columns where a paper number exists);
    ``markers``: text after a row's method (its footnote's reference)."""
    benchmarks = _ordered([c.benchmark for c in cells], BENCHMARK_ORDER)
    rows = _row_order(cells)
    lookup = {(c.method, c.benchmark): c for c in cells}
    with_paper = {c.benchmark for c in cells if c.paper is not None}
    header = ["method"]
    for b in benchmarks:
        header += [f"{b} ours", f"{b} paper", f"{b} Δ"] if b in with_paper else [b]
    lines = ["| " + " | ".join(_escape(h) for h in header) + " |",
             "|" + "---|" + "---:|" * (len(header) - 1)]
    for method in rows:
        row = [_escape(method + (markers or {}).get(method, ""))]
        for b in benchmarks:
            cell = lookup.get((method, b))
            row.append(fmt_ours(cell, digits) if cell else EMPTY)
            if b in with_paper:
                row.append(fmt_paper(cell.paper, digits) if cell and cell.paper is not None else EMPTY)
                row.append(fmt_diff(cell.diff, digits) if cell and cell.diff is not None else EMPTY)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def row_notes(cells: list[Cell]) -> dict[str, str]:
    """The footnote of each row (method) of one table whose cells carry notes, in row order; a note of a row
    with several benchmarks names the benchmark."""
    out: dict[str, str] = {}
    for method in _row_order(cells):
        mine = [c for c in cells if c.method == method and c.notes]
        several = len({c.benchmark for c in cells if c.method == method}) > 1
        texts = [f"{c.benchmark}: {n}" if several else n for c in mine for n in c.notes]
        if texts:
            out[method] = "; ".join(dict.fromkeys(texts))
    return out


def markdown(cells: list[Cell], runs: list[Run], metric: str = "success", digits: int = 1) -> str:
    """The whole report: one titled table per ``report.table`` with its paper sources, then runs without a result."""
    with_value = sum(r.value is not None for r in runs)
    parts = [f"# marl report: eval/{metric}" + (" (%)" if scale(metric) == 100.0 else ""), "",
             f"{len(runs)} run{'s' if len(runs) != 1 else ''}, {with_value} with a result; "
             "cells show mean ± sample std over seeds (n = runs)."]
    footnotes = 0
    for table in dict.fromkeys(c.table for c in cells):
        mine = [c for c in cells if c.table == table]
        notes = row_notes(mine)
        markers = {method: f" [^{footnotes + i}]" for i, method in enumerate(notes, 1)}
        parts += ["", f"## {table}", "", markdown_table(mine, digits, markers)]
        for method, text in notes.items():
            footnotes += 1
            parts += ["", f"[^{footnotes}]: {method}: {text}"]
        sources = list(dict.fromkeys(c.source for c in mine if c.paper is not None and c.source))
        if sources:
            parts += ["", "Paper numbers: " + "; ".join(sources)]
    if not cells:
        parts += ["", "No run has a result."]
    missing = [r for r in runs if r.value is None]
    if missing:
        parts += ["", "## Runs without a result", ""]
        parts += [f"- `{r.path}`: {r.reason or 'no result'}" for r in missing]
    return "\n".join(parts) + "\n"


def _num(value: float | None) -> str:
    return "" if value is None else repr(round(value, 6))


def cells_csv(cells: list[Cell]) -> str:
    """``report.csv``: one row per cell."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["table", "method", "benchmark", "ours_mean", "ours_std", "n", "paper", "diff", "source", "runs",
                     "notes"])
    for c in cells:
        writer.writerow([c.table, c.method, c.benchmark, _num(c.mean), _num(c.std), c.n, _num(c.paper),
                         _num(c.diff), c.source or "", ";".join(c.runs), "; ".join(c.notes)])
    return out.getvalue()


def runs_csv(runs: list[Run]) -> str:
    """``runs.csv``: one row per discovered run dir."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run_dir", "status", "table", "method", "benchmark", "seed", "value", "reason"])
    for r in runs:
        writer.writerow([r.path, r.status, r.table, r.method, r.benchmark, "" if r.seed is None else r.seed,
                         _num(r.value), r.reason or ""])
    return out.getvalue()
