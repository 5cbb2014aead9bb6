"""Finding run directories and reading each into a ``Run``: its cell (table, method, benchmark) and value.

A run dir holds ``.hydra/config.yaml`` or ``summary.json``; any other directory is searched for run dirs.
Labels come from the run's ``report:`` node when set, else from its workflow, algorithm, policy and env.
A run whose overrides change its experiment's budget says so (``report.budget``).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import math
import os
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from marl_cli.algorithms import ALGORITHMS
from marl_cli.report.budget import budget_differences, experiment_of

BOOKKEEPING = ("seed", "logger", "progress", "hydra", "hparams_search", "trainer.resume")
"""Config keys (and override keys) that never tell two runs' setups apart."""
BEFORE_IGNORED = ("name", "report", "algorithm", "trainer")
"""Keys that do not change a run's starting point (``eval_before``); ``trainer.warmstart``/``init_from`` do."""
BEFORE_KEPT = ("trainer.warmstart", "trainer.init_from")
SINGLE_AGENT_WORKFLOWS = ("single_agent", "solo_research")
GLOB_CHARS = "*?["

BENCHMARKS = {"plan_path": "Plan-Path", "sudoku": "Sudoku", "sokoban": "Sokoban"}
SOURCES = {"aime24": "AIME24", "aime25": "AIME25", "olympiadbench": "OlympiadBench",
           "livecodebench": "LiveCodeBench", "apps": "APPS", "code_contests": "CodeContests", "gaia": "GAIA",
           "xbench": "XBench-DeepSearch", "webwalkerqa": "WebWalkerQA"}
EMBEDDED = {"math": "Math (embedded)", "code": "Code (embedded)", "research": "Research (embedded)"}


class ReportError(Exception):
    """A problem with what ``marl report`` was asked to read (one line, shown as a usage error)."""


@dataclass
class Run:
    """One run dir as the report sees it. ``value``/``before`` are percentages; ``reason`` says why no value."""

    path: str
    status: str  # completed | failed | running | interrupted | missing (no summary.json) | unknown
    command: str  # train | eval
    config: dict[str, Any]
    overrides: list[str]
    table: str
    method: str
    benchmark: str
    seed: int | None
    value: float | None = None
    reason: str | None = None
    before: float | None = None
    before_method: str | None = None
    paper: float | None = None
    source: str | None = None
    key: str = ""  # equal for runs that differ only in seed and bookkeeping
    before_key: str = ""  # equal for runs that start from the same point (eval_before)
    has_metrics: bool = False
    experiment: str | None = None  # the experiment its overrides name
    budget: list[str] = field(default_factory=list)  # budget keys set otherwise than the experiment does


# ---------------------------------------------------------------- discovery

def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file() or (path / "summary.json").is_file()


def is_report_dir(path: Path) -> bool:
    """A ``marl report`` output dir (its config has ``runs`` and no ``env``): never a run."""
    config = _read_yaml(path / ".hydra" / "config.yaml")
    return isinstance(config, dict) and "runs" in config and "env" not in config


def is_resume_leftover(path: Path) -> bool:
    """A dir that an older marl made when resuming another run (``trainer.resume`` pointing elsewhere): only its
    ``.hydra/`` and a log, no ``summary.json`` nor ``metrics.jsonl`` (the resumed run's own dir holds the results)."""
    if (path / "summary.json").exists() or (path / "metrics.jsonl").exists():
        return False
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml")
    resumed = [str(o).split("=", 1)[1].strip("'\"") for o in overrides or [] if str(o).startswith("trainer.resume=")]
    return bool(resumed) and Path(resumed[0]).expanduser().resolve() != path.resolve()


def find_run_dirs(root: Path) -> list[Path]:
    """``root`` if it is a run dir, else every run dir below it (not descending into run dirs), in natural order;
    a search skips the empty dirs older resumes left (:func:`is_resume_leftover`)."""
    if is_run_dir(root):
        return [] if is_report_dir(root) else [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if here != root and is_run_dir(here):
            if not is_report_dir(here) and not is_resume_leftover(here):
                found.append(here)
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(found, key=natural_key)


NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def natural_key(path: Path | str) -> list[tuple[list[Any], str]]:
    """Sort key comparing numbers in each path part by value: ``seed=2`` < ``seed=10``, ``lr=0.05`` < ``lr=0.1``."""
    return [([float(t) if i % 2 else t for i, t in enumerate(NUMBER.split(part))], part)
            for part in Path(path).parts]


def expand(pattern: str) -> list[Path]:
    """The paths a run argument names: the glob's matches (natural order), or the path itself when it exists."""
    pattern = os.path.expanduser(pattern)
    if any(c in pattern for c in GLOB_CHARS):
        return [Path(p) for p in sorted(glob.glob(pattern, recursive=True), key=natural_key)]
    return [Path(pattern)] if os.path.exists(pattern) else []


def discover(patterns: Iterable[str]) -> list[Path]:
    """Run dirs named by paths or globs, in argument order without repeats; ReportError for one naming none."""
    out: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        matches = expand(pattern)
        if not matches:
            raise ReportError(f"{pattern}: no such file or directory" +
                              (" (the glob matches nothing)" if any(c in pattern for c in GLOB_CHARS) else ""))
        dirs: list[Path] = []
        for match in matches:
            if match.is_file():
                if match.name == "summary.json" or match.parent.name == ".hydra":
                    parent = match.parent.parent if match.parent.name == ".hydra" else match.parent
                    dirs.extend(find_run_dirs(parent))
            else:
                dirs.extend(find_run_dirs(match))
        if not dirs:
            raise ReportError(f"{pattern}: no run directories (with .hydra/config.yaml or summary.json) there")
        for d in dirs:
            resolved = d.resolve()
            if resolved not in seen:
                seen.add(resolved)
                out.append(d)
    return out


# ---------------------------------------------------------------- reading

def _read_yaml(path: Path) -> Any:
    """A YAML file as plain dicts/lists (interpolations left as written), or None when it cannot be read."""
    if not path.is_file():
        return None
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # a half-written or hand-edited file: the run is listed with a reason instead
        return None


def get(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``, or ``default`` when a part is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _without(config: dict[str, Any], dotted: Iterable[str]) -> dict[str, Any]:
    out = json.loads(json.dumps(config, default=str))
    for key in dotted:
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a nested config as (dotted key, value); an empty mapping is a leaf."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    elif prefix:
        yield prefix[:-1], node


def _defaults(schema: type, group: str) -> dict[str, Any]:
    node = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False, enum_to_str=True)
    return {key: value for key, value in leaves(node, f"{group}.") if value != "???"}


@functools.cache
def schema_defaults() -> dict[str, Any]:
    """Every config group's schema defaults by dotted key (``trainer.epo_coef``: 0.0); required keys left out."""
    from marl_cli.config.schema import GROUP_SCHEMAS

    out: dict[str, Any] = {}
    for group, schema in GROUP_SCHEMAS.items():
        out.update(_defaults(schema, group))
    return out


@functools.cache
def plugin_schema(group: str, name: str) -> type | None:
    """The schema the plug-in ``name`` of ``group`` registered (None: none, or no such plug-in)."""
    from marl_cli.config.registry import schema_of
    from marl_cli.plugins import load_all

    load_all()
    return schema_of(group, name)


RETIRED = {"trainer.epo_coef": 0.0, "trainer.epo_penalty": 0.1, "trainer.epo_corridor_low": 0.8,
           "trainer.epo_corridor_high": 1.2, "trainer.epo_decay": 3.0, "trainer.epo_window": 0}
"""Keys an older marl saved, at the values that did what a run without them does (EPO was ``trainer.epo_*``)."""
OFF = ("credit", "critic", "loss", "reward")
"""Groups whose option ``none`` adds nothing: ``{name: none}`` is the setup of a run saved before the group existed."""


def without_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the settings at their schema default: a run saved before a key existed and one that
    leaves it at its default have the same setup (a group option's own defaults may differ: they stay; ``RETIRED``
    and ``OFF`` say what older runs saved that means the same). In
    ``UNREAD``'s groups the selected plug-in's schema gives the defaults, and a key it lacks (saved by an older marl
    whose one schema held every plug-in's keys) was never read, so it goes too."""
    from marl_cli.config.validate import UNREAD

    defaults, unread = dict(schema_defaults()), []
    for group in UNREAD:
        schema = plugin_schema(group, str(get(config, f"{group}.name")))
        if schema is not None:
            defaults.update(_defaults(schema, group))
            read = {f.name for f in dataclasses.fields(schema)}
            unread += [f"{group}.{key}" for key in get(config, group, {}) if key not in read]
    defaults.update(RETIRED)
    out = _without(config, [*unread, *(key for key, value in leaves(config) if key in defaults and
                                       json.dumps(value, default=str) == json.dumps(defaults[key]))])
    return _without(out, [group for group in OFF if out.get(group) == {"name": "none"}])


def setup_key(config: dict[str, Any], load_key: str | None = None) -> str:
    """A string equal for configs that differ only in seed, bookkeeping and settings at their schema default (an
    eval's ``load`` by its run's key)."""
    stripped = _without(without_defaults(config), BOOKKEEPING)
    if load_key is not None:
        stripped["load"] = load_key
    return json.dumps(stripped, sort_keys=True)


def before_key(config: dict[str, Any]) -> str:
    """A string equal for runs that start from the same model (only RL settings and labels may differ)."""
    config = without_defaults(config)
    kept = {k: get(config, k) for k in BEFORE_KEPT}
    stripped = _without(config, (*BOOKKEEPING, *BEFORE_IGNORED))
    return json.dumps({**stripped, "_kept": kept}, sort_keys=True)


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def is_bookkeeping(override: str) -> bool:
    key = override_key(override)
    return any(key == b or key.startswith(b + ".") for b in BOOKKEEPING)


def loaded_run(load: str) -> Path:
    """The run dir of an eval's ``load`` (a run dir, or a checkpoint dir ``<run>/checkpoints/step_N``)."""
    path = Path(os.path.expanduser(load))
    return path.parent.parent if path.parent.name == "checkpoints" else path


def loaded_name(load: str) -> str:
    """The name of the run an eval loaded, or the last two parts of its path when that run cannot be read."""
    run = loaded_run(load)
    config = _read_yaml(run / ".hydra" / "config.yaml")
    if isinstance(config, dict) and config.get("name"):
        return str(config["name"])
    summary = _read_json(run / "summary.json")
    if summary and summary.get("name"):
        return str(summary["name"])
    return "/".join(run.parts[-2:])


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def method_label(config: dict[str, Any], command: str = "train", loaded: str | None = None) -> str:
    """The row label derived from workflow, algorithm and policy regime (used when ``report.method`` is unset).

    An eval of a trained run is ``eval of <loaded>`` (default: the loaded run's name, read from its dir).
    """
    single = get(config, "workflow.name") in SINGLE_AGENT_WORKFLOWS
    load = config.get("load")
    if command == "eval" and load:
        return f"eval of {loaded or loaded_name(str(load))}"
    if get(config, "trainer.steps") == 0 or command == "eval":
        return "single agent" if single else "MAS, prompt only"
    algorithm = get(config, "algorithm.name")
    label = ALGORITHMS.get(algorithm).label if algorithm in ALGORITHMS else None
    if label is None:
        return str(algorithm or "unknown method")
    return label(lambda key: get(config, key), single)


def benchmark_label(config: dict[str, Any]) -> str:
    """The column label derived from the env (used when ``report.benchmark`` is unset)."""
    env = str(get(config, "env.name", "unknown env"))
    if env in BENCHMARKS:
        return BENCHMARKS[env]
    if env in EMBEDDED:
        source = get(config, "env.eval.source", "embedded")
        if source and source != "embedded":
            return SOURCES.get(str(source), str(source))
        return EMBEDDED[env]
    return env


def _from_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A stand-in config for a run whose ``.hydra/config.yaml`` is missing (older runs)."""
    return {"name": summary.get("name"), "env": {"name": summary.get("env")},
            "workflow": {"name": summary.get("workflow")}, "algorithm": {"name": summary.get("algorithm")},
            "policy": {"name": summary.get("regime")}, "trainer": {"steps": summary.get("total_steps")}}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _status_reason(summary: dict[str, Any], logged: int | None = None) -> str:
    """Why a run has no result; ``logged``: the last step its ``metrics.jsonl`` holds (a running run's summary
    is rewritten only at checkpoints, so it may lag)."""
    status = summary.get("status", "unknown")
    if status == "failed":
        error = str(summary.get("error") or "no error recorded").strip().splitlines()
        first = error[0] if error else "no error recorded"
        return f"status failed: {first[:200]}"
    steps, total = summary.get("steps"), summary.get("total_steps")
    if logged is not None and (not isinstance(steps, int) or logged > steps):
        steps = logged
    where = f" (step {steps} of {total})" if steps is not None and total is not None else ""
    if status == "running" and process_gone(summary):
        return f"status running{where}, but its process {summary['pid']} is gone (killed?): resume it with " \
               f"trainer.resume={summary.get('run_dir', '<run dir>')}"
    return f"status {status}{where}"


def metrics_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The step records among a ``metrics.jsonl``'s lines: those that parse and hold a finite ``step``;
    unreadable lines (a crash mid-write, a line cut by reading from the middle) are skipped."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int | float) and not isinstance(step, bool) and math.isfinite(step):
            yield record


def last_logged_step(metrics: Path, tail_bytes: int = 65536) -> int | None:
    """The ``step`` of the last complete record of a ``metrics.jsonl`` (read from its end), None without one."""
    try:
        with metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    records = list(metrics_records(lines))
    return int(records[-1]["step"]) if records else None


def process_gone(summary: dict[str, Any]) -> bool:
    """Whether the process that wrote a "running" summary on this machine no longer exists."""
    pid = summary.get("pid")
    if not isinstance(pid, int) or summary.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


def load_run(path: Path, metric: str = "success") -> Run:
    """Read one run dir: its config, overrides, summary, labels, seed, and the value ``eval/<metric>`` (× 100 for a
    rate: ``scale``)."""
    config = _read_yaml(path / ".hydra" / "config.yaml")
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml")
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else []
    summary = _read_json(path / "summary.json")
    reason = None
    if not (path / "summary.json").exists():
        status, reason = "missing", "no summary.json"
    elif summary is None:
        status, reason = "unknown", "unreadable summary.json"
    else:
        status = str(summary.get("status", "unknown"))
    if not isinstance(config, dict):
        if summary is None:
            config, reason = {}, reason or "unreadable .hydra/config.yaml"
        else:
            config = _from_summary(summary)
    command = str((summary or {}).get("command") or ("eval" if "load" in config and "eval" in config else "train"))
    report = config.get("report") if isinstance(config.get("report"), dict) else {}
    load = config.get("load") if command == "eval" else None
    load_key, name = None, None
    if load:  # an eval summary names the run it loaded; a checkpoint dir's run is two levels up
        run_dir = Path(str((summary or {}).get("loaded_run") or loaded_run(str(load))))
        loaded = _read_yaml(run_dir / ".hydra" / "config.yaml")
        load_key = setup_key(loaded) if isinstance(loaded, dict) else str(load)
        name = (summary or {}).get("loaded_name")
    seed = config.get("seed")
    method = str(report.get("method") or method_label(config, command, name))
    dry = next((o.split("=", 1)[1] for o in overrides if o.startswith("dry_run=") and o != "dry_run=null"), None)
    if dry:  # the plumbing check of an experiment: its own row, never set beside the paper's number
        method, report = f"{method} [dry run: {dry}]", {**report, "paper": None}
    run = Run(path=str(path), status=status, command=command, config=config, overrides=overrides,
              table=str(report.get("table") or "runs"),
              method=method,
              benchmark=str(report.get("benchmark") or benchmark_label(config)),
              seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
              before_method=report.get("before_method"), paper=_number(report.get("paper")),
              source=report.get("source"), key=setup_key(config, load_key), before_key=before_key(config),
              has_metrics=(path / "metrics.jsonl").is_file(), experiment=experiment_of(overrides),
              budget=budget_differences(config, overrides, BOOKKEEPING))
    run.reason = reason if reason is not None or summary is None else _result(run, summary, metric)
    return run


NOT_RATES = ("nash_conv", "games", "tasks", "turns", "return", "completion_tokens")
"""Metrics that are not shares of episodes: the report shows them as they are, not in percent."""


def scale(metric: str) -> float:
    """What the report multiplies ``eval/<metric>`` by: 100 for a rate (success, pass@k, a win rate), else 1."""
    return 1.0 if any(part in NOT_RATES for part in metric.split("/")) else 100.0


def _result(run: Run, summary: dict[str, Any], metric: str) -> str | None:
    """Set ``run``'s value (and starting point) from its summary; return why it has none (None: it has one)."""
    if run.status != "completed":
        return _status_reason(summary, last_logged_step(Path(run.path) / "metrics.jsonl"))
    before = _number(summary.get(f"eval_before/{metric}"))
    if run.before_method and before is not None:
        run.before = scale(metric) * before
    value = _number(summary.get(f"eval/{metric}"))
    if value is None:
        return f"no eval/{metric}"
    run.value = scale(metric) * value
    return None


def load_runs(patterns: Iterable[str], metric: str = "success") -> list[Run]:
    """Every run dir the patterns name, read."""
    return [load_run(path, metric) for path in discover(patterns)]
