"""Training curves of each run (``metrics.jsonl``) as PNG files: reward and success per agent over steps.

Roles are the ``x`` of ``train/<x>/success`` keys (a policy trainer's namespace ``train/<policy>/...``
may also log a ``reward``, never a ``success``). matplotlib is imported only here, with the Agg canvas.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from marl_cli.report.runs import Run

ROLE_KEY = re.compile(r"^train/([^/]+)/success$")
POLICY_KEY = re.compile(r"^train/([^/]+)/loss$")
REWARD_KEY = re.compile(r"^train/([^/]+)/reward$")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; unreadable lines (a crash mid-write) are skipped."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int | float):
            records.append(record)
    return records


def agent_roles(records: list[dict[str, Any]]) -> list[str]:
    """Roles with ``train/<role>/success``; for older files, ``train/<x>/reward`` minus policy namespaces."""
    keys = {k for r in records for k in r}
    roles = sorted({m.group(1) for k in keys if (m := ROLE_KEY.match(k))})
    if roles:
        return roles
    policies = {m.group(1) for k in keys if (m := POLICY_KEY.match(k))}
    return sorted({m.group(1) for k in keys if (m := REWARD_KEY.match(k))} - policies)


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records holding a number under ``key``."""
    points = [(float(r["step"]), float(r[key])) for r in records
              if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
    return [p[0] for p in points], [p[1] for p in points]


def slug(text: str) -> str:
    """A file-name-safe form of ``text``."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_.") or "run"


def plot_file_name(run: Run) -> str:
    seed = f"seed{run.seed}" if run.seed is not None else "seed_unknown"
    return "__".join(slug(p) for p in (run.table, run.method, run.benchmark, seed))


def plot_run(records: list[dict[str, Any]], title: str, path: Path) -> Path:
    """Write one PNG: reward per agent (left) and success per agent with eval success points (right)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # Hydra's root logger would show font-cache notes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    reward_ax, success_ax = fig.subplots(1, 2)
    for role in agent_roles(records):
        for ax, key in ((reward_ax, f"train/{role}/reward"), (success_ax, f"train/{role}/success")):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, label=role)
    if not success_ax.lines:  # older files log only the episode's success
        steps, values = series(records, "train/success")
        if steps:
            success_ax.plot(steps, values, color="grey", label="episode (train)")
    steps, values = series(records, "eval_before/success")
    eval_steps, eval_values = series(records, "eval/success")
    if steps or eval_steps:
        success_ax.plot(steps + eval_steps, values + eval_values, "o--", color="black", label="eval (held out)")
    reward_ax.set(title="reward per agent", xlabel="step", ylabel="train reward")
    success_ax.set(title="success per agent", xlabel="step", ylabel="success", ylim=(-0.02, 1.02))
    for ax in (reward_ax, success_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def plot_runs(runs: list[Run], out_dir: Path) -> list[Path]:
    """One PNG per run with a ``metrics.jsonl`` holding at least one record, named by table/method/benchmark/seed."""
    written: list[Path] = []
    used: set[str] = set()
    for run in runs:
        if not run.has_metrics:
            continue
        records = read_metrics(Path(run.path) / "metrics.jsonl")
        if not records:
            continue
        name, i = plot_file_name(run), 1
        while name in used:
            i += 1
            name = f"{plot_file_name(run)}_{i}"
        used.add(name)
        title = f"{run.method} · {run.benchmark} · seed {run.seed}\n{run.path}"
        written.append(plot_run(records, title, out_dir / f"{name}.png"))
    return written
