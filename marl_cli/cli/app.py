"""Running a Hydra app from ``marl <command>``: validate overrides first, then hand over to Hydra."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import register_configs
from marl_cli.config.validate import check_overrides

INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--shell-completion", "-sc"}
"""Flags that only print something; no run starts, so overrides are left to Hydra."""
VALUE_FLAGS = {"-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
               "--experimental-rerun"}
"""Flags of a run whose next argument is their value, not an override."""


def overrides_in(args: list[str]) -> list[str]:
    """The ``key=value`` overrides among Hydra's command-line arguments."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUE_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def fail(command: str, message: str) -> None:
    print(f"marl {command}: error: {message}", file=sys.stderr)
    sys.exit(2)


def run_app(command: str, config_name: str, hydra_main: Callable[[], object], args: list[str]) -> None:
    """Check ``args``' overrides against the schemas, then run ``hydra_main`` with them as ``sys.argv``."""
    register_configs()
    if not INFO_FLAGS.intersection(args):
        try:
            check_overrides(config_name, overrides_in(args))
        except ConfigError as exc:
            fail(command, str(exc))
    sys.argv = [f"marl-{command}", *args]
    hydra_main()


def run_job(command: str, job: Callable[[DictConfig, Path], dict[str, Any]], cfg: DictConfig) -> float | None:
    """Run ``job`` (train or eval) in Hydra's run dir; return its final eval success (what sweepers optimise)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    if cfg.threads < 0:
        fail(command, f"threads must be 0 (torch's default) or a positive count, got {cfg.threads}")
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    try:
        summary = job(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as exc:
        fail(command, str(exc))
    return summary.get("eval/success")
