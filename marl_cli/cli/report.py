"""``marl report``: the Hydra app over ``conf/report.yaml``.

``marl report a b "multirun/x/*" --plot metric=success`` becomes ``runs=['a','b','multirun/x/*']
plot=true metric=success`` before Hydra sees it. Which arguments are runs:

- an argument starting with ``-`` is a flag (``--plot`` means ``plot=true``; others go to Hydra);
- an argument without ``=`` is a run path or glob;
- an argument with ``=`` is a run path if it exists on disk, or if the part before its first ``=``
  holds a ``/`` or a glob character (``*?[``), as in ``multirun/x/trainer.learning_rate=0.001/seed=0``;
  otherwise it is a Hydra override (``metric=pass@1``, ``digits=2``, ``hydra.run.dir=/tmp/r``).

Paths are quoted in Hydra's list syntax, so ``=``, ``,`` and spaces in them are safe.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from marl_cli.cli.app import INFO_FLAGS, VALUE_FLAGS, fail, hydra_quote, overrides_in, run_app
from marl_cli.config.paths import config_dir
from marl_cli.report.runs import GLOB_CHARS, ReportError, discover

USAGE = "usage: marl report <run dirs, sweep dirs or globs> [--plot] [metric=<name>] [digits=<n>]"


def is_run_argument(arg: str) -> bool:
    """Whether a positional argument names runs (a path or glob) rather than a Hydra override."""
    if "=" not in arg:
        return True
    key = arg.split("=", 1)[0]
    return os.path.exists(arg) or "/" in key or any(c in key for c in GLOB_CHARS)


def split_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """(run paths and globs, the other arguments with ``--plot`` as ``plot=true``)."""
    paths: list[str] = []
    rest: list[str] = []
    value_next = False
    for arg in args:
        if value_next:
            rest.append(arg)
            value_next = False
        elif arg in VALUE_FLAGS:
            rest.append(arg)
            value_next = True
        elif arg == "--plot":
            rest.append("plot=true")
        elif arg.startswith("-"):
            rest.append(arg)
        elif is_run_argument(arg):
            paths.append(arg)
        else:
            rest.append(arg)
    return paths, rest


def hydra_arguments(paths: list[str], rest: list[str]) -> list[str]:
    """Hydra's arguments from ``split_arguments``' two lists."""
    given = any(o.split("=", 1)[0].lstrip("+~") == "runs" for o in overrides_in(rest))
    if paths and given:
        fail("report", "name runs either as arguments or as runs=[...], not both")
    if paths:
        rest.insert(0, "runs=[" + ",".join(hydra_quote(p) for p in paths) + "]")
    elif not given and not INFO_FLAGS.intersection(rest):
        fail("report", f"no runs given; {USAGE}")
    return rest


@hydra.main(config_path=str(config_dir()), config_name="report", version_base="1.3")
def report_app(cfg: DictConfig) -> None:
    """Tabulate the runs; print the Markdown and the files written to Hydra's run dir."""
    from marl_cli.report import make_report

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        report = make_report([str(p) for p in cfg.runs], out_dir, cfg.metric, cfg.digits, cfg.plot)
    except ReportError as exc:
        fail("report", str(exc))
    print(report.markdown)
    print("Wrote:")
    for path in report.files:
        print(f"  {path}")


def run(args: list[str]) -> None:
    paths, rest = split_arguments(args)
    hydra_args = hydra_arguments(paths, list(rest))
    if paths and not INFO_FLAGS.intersection(rest):
        try:  # fail on a path naming nothing before Hydra makes a run dir for this report
            discover(paths)
        except ReportError as exc:
            fail("report", str(exc))
    run_app("report", "report", report_app, hydra_args)
