"""Running a Hydra app from ``marl <command>``: validate overrides first, then hand over to Hydra."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from marl_cli.config.errors import ConfigError, RunError
from marl_cli.config.launch import launched_rank, launched_world_size
from marl_cli.config.paths import config_dirs_in
from marl_cli.config.registry import load_plugins
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs
from marl_cli.tracking.tracker import write_json

INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--shell-completion", "-sc"}
"""Flags that only print something; no run starts, so overrides are only composed (a bad one is one line)."""
VALUE_FLAGS = {"-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
               "--experimental-rerun"}
"""Flags of a run whose next argument is their value, not an override."""
PRINT_FLAGS = {"-c", "--cfg", "-i", "--info"}
PRINT_CHOICES = {"job", "hydra", "all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
"""``--cfg job``, ``--info defaults``: flags whose next argument, one of these words, is their value."""
MULTIRUN_FLAGS = {"-m", "--multirun"}
COMPLETION_FLAGS = {"-sc", "--shell-completion"}
MODES = (MULTIRUN_FLAGS, {"-c", "--cfg"}, {"-i", "--info"}, COMPLETION_FLAGS)
"""What Hydra does with a command line, one at a time: run a sweep, print the config, print info, complete."""
HELP_FLAGS = {"-h", "--help"}
"""marl's own help (groups with what they are for); ``--hydra-help`` is Hydra's."""
FAILED_JOBS: list[tuple[str, str]] = []
"""(job dir, error) of the sweep's failed jobs in this process."""


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Hydra's command-line arguments as (the ``key=value`` overrides, the flags with their values), each in order."""
    overrides, flags, skip = [], [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            flags.append(arg)
        elif arg in VALUE_FLAGS or (arg in PRINT_FLAGS and args[i + 1:i + 2] and args[i + 1] in PRINT_CHOICES):
            skip = True
            flags.append(arg)
        elif arg.startswith("-"):
            flags.append(arg)
        else:
            overrides.append(arg)
    return overrides, flags


def overrides_in(args: list[str]) -> list[str]:
    """The ``key=value`` overrides among Hydra's command-line arguments."""
    return split_args(args)[0]


def key_of(override: str) -> str:
    """The key an override sets (``trainer.steps`` of ``+trainer.steps=3``, ``experiment`` of ``~experiment``)."""
    return override.split("=", 1)[0].lstrip("+~")


def hydra_quote(text: str) -> str:
    """``text`` as a single-quoted Hydra override string (quotes escaped; no interpolation)."""
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)  # OmegaConf: a literal "${"
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)  # Hydra: backslashes before a quote
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text + "'"


LOADS_A_RUN = ("trainer.resume", "load")
"""Overrides that continue or evaluate an earlier run: the run's own overrides apply unless given again."""


def quoted_paths(args: list[str]) -> list[str]:
    """``args`` with each ``load=`` / ``trainer.resume=`` path that holds ``=`` or ``,`` (a sweep's job dirs:
    ``multirun/x/seed=1``, ``multirun/y/experiment=a,trainer.learning_rate=0.1/seed=0``) quoted, as Hydra's override
    grammar needs; a value that is no existing path is a sweep's list (``a,b``), each path of it quoted alone."""
    quoted = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in LOADS_A_RUN and ("=" in value or "," in value) and value[:1] not in "'\"":
            parts = [value] if Path(value).expanduser().exists() else value.split(",")
            arg = f"{key}=" + ",".join(f"'{part}'" if "=" in part or "," in part else part for part in parts)
        quoted.append(arg)
    return quoted


def unquoted(value: str) -> str:
    """An override's value without the quotes Hydra's grammar strips (``'a/seed=1'`` is ``a/seed=1``)."""
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def inherited_overrides(args: list[str]) -> list[str]:
    """The overrides an earlier run was started with (its ``.hydra/overrides.yaml``) when ``args`` resume
    (``trainer.resume=<run>``) or evaluate (``load=<run or checkpoint>``) it, but those ``args`` set again,
    so the run continues with its own config (its experiment, env size, ...) without repeating it."""
    given = {key_of(o) for o in overrides_in(args)}
    for override in overrides_in(args):
        key, _, value = override.partition("=")
        if key.lstrip("+") not in LOADS_A_RUN or not value:
            continue
        path = Path(unquoted(value)).expanduser()
        run = path.parents[1] if path.parent.name == "checkpoints" else path
        saved = run / ".hydra" / "overrides.yaml"
        if not saved.exists():
            return []
        return [o for o in yaml.safe_load(saved.read_text()) or []
                if key_of(o) not in given | set(LOADS_A_RUN) and not o.startswith("hydra")]
    return []


def fail(command: str, message: str, code: int = 2) -> None:
    print(f"marl {command}: error: {message}", file=sys.stderr)
    sys.exit(code)


NO_EXPERIMENT = "experiment=null"
"""The opt-out of an experiment as users write it; Hydra 1.3 refuses a null group override."""


def run_app(command: str, config_name: str, hydra_main: Callable[[], object], args: list[str],
            hint: Callable[[], str] | None = None) -> None:
    """Check ``args``' overrides against the schemas, then run ``hydra_main`` with them as ``sys.argv``;
    ``hint()`` ends the message of a config that does not check. ``experiment=null`` (no experiment) becomes
    Hydra 1.3's ``~experiment``, which deletes the defaults-list entry."""
    args = quoted_paths(["~experiment" if arg == NO_EXPERIMENT else arg for arg in args])
    install = [a.split("=", 1)[1] for a in args if a.startswith("install=")]
    if COMPLETION_FLAGS.intersection(args) and install:
        from marl_cli.cli.completion import run

        run(install)  # Hydra's would complete a `marl-<command>` program, which does not exist
        sys.exit(0)
    if HELP_FLAGS.intersection(args):
        from marl_cli.cli.help import help_text

        print(help_text(command, args))
        sys.exit(0)
    modes = [next(f for f in args if f in mode) for mode in MODES if mode.intersection(args)]
    if len(modes) > 1:
        fail(command, f"{' and '.join(modes)}: give one of them (Hydra runs, prints or completes, one at a time)")
    try:
        register_configs()
        if not COMPLETION_FLAGS.intersection(args):
            args = [*inherited_overrides(args), *args]
            check_overrides(config_name, overrides_in(args), config_dirs_in(args),
                            full=not INFO_FLAGS.intersection(args))
    except ConfigError as exc:
        fail(command, f"{exc}{hint() if hint else ''}")
    if command == "train" and launched_world_size() > 1:
        if MULTIRUN_FLAGS.intersection(args):
            fail(command, "a sweep (-m) starts its own jobs; launch one run per torchrun/accelerate launch")
        from marl_cli.core.world import launch_overrides

        args = [*args, *launch_overrides(args)]
    overrides, flags = split_args(args)  # overrides first: Hydra's parser drops those that follow a flag's value
    sys.argv = [f"marl-{command}", *overrides, *flags]
    FAILED_JOBS.clear()
    try:
        hydra_main()
    finally:
        leave_process_group()
    if FAILED_JOBS:
        fail(command, f"{len(FAILED_JOBS)} job(s) of the sweep failed (the others ran): "
             + "; ".join(f"{d}: {e}" for d, e in FAILED_JOBS))


def leave_process_group() -> None:
    """Leave the launcher's process group (``torchrun``), if this process joined one, before the interpreter exits:
    a group left to the interpreter's teardown has its gloo threads destroyed in no set order, which can end a rank
    in ``terminate called without an active exception`` after its work is done."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_job(command: str, job: Callable[[DictConfig, Path], dict[str, Any]], cfg: DictConfig) -> float | None:
    """Run ``job`` (train or eval) in Hydra's run dir; return its final eval success (what sweepers optimise).
    The first line the job prints (rank 0 only) is its run dir: a resumed run's own dir when it resumes one."""
    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    if launched_rank() == 0:
        print(f"run dir: {shown(Path(OmegaConf.select(cfg, 'trainer.resume') or run_dir).resolve())}", flush=True)
    import datasets
    import transformers

    load_plugins()  # a launcher's worker process imports the user's plug-ins too
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    from marl_cli.core.world import World

    if not World.current().main:  # rank 0 reports for the run
        logging.getLogger().setLevel(logging.WARNING)
    try:
        summary = job(cfg, run_dir)
    except Exception as exc:
        if hydra.mode != RunMode.MULTIRUN:
            if isinstance(exc, RunError):  # what it saved stands: the run dir stays
                fail(command, str(exc), code=1)
            if not isinstance(exc, ConfigError):
                raise
            remove_if_empty(run_dir)
            fail(command, str(exc))
        return sweep_job_failed(run_dir, Path(hydra.sweep.dir), exc)
    return summary.get("eval/success")


def shown(path: Path) -> Path:
    """``path`` relative to the working dir when it is below it (``outputs/...``), else absolute."""
    cwd = Path.cwd()
    return path.relative_to(cwd) if path.is_relative_to(cwd) else path


def sweep_job_failed(run_dir: Path, sweep_dir: Path, exc: Exception) -> None:
    """A sweep goes on past a failing job: its error is logged, kept in its ``summary.json`` (status
    ``failed``) and, with the in-process launcher, makes ``marl`` exit 2 once every job has run."""
    error = str(exc) if isinstance(exc, ConfigError | RunError) else f"{type(exc).__name__}: {exc}"
    name = str(run_dir.relative_to(sweep_dir)) if run_dir.is_relative_to(sweep_dir) else str(run_dir)
    logging.getLogger("marl_cli").error("job %s failed: %s", name, error)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"run_dir": str(run_dir)}
    summary.update(status="failed", error=error)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(summary_path, summary)
    FAILED_JOBS.append((name, error))


STARTUP_FILES = {".hydra", "train.log", "eval.log", "summary.json", "tiny_init"}
"""What a run dir holds before anything is measured or trained."""


def remove_if_empty(run_dir: Path) -> None:
    """Delete the run dir of a start refused by a config error when it holds only start-up files."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= STARTUP_FILES:
        shutil.rmtree(run_dir)
