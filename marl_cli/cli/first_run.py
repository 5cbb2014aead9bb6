"""The run ``marl train`` and ``marl eval`` start from when the command line names no experiment and loads no run:
``experiment=embedded``, the first run, which learns on a laptop CPU (``experiment=null``: the bare group defaults)."""

from __future__ import annotations

from collections.abc import Callable

from marl_cli.cli.app import LOADS_A_RUN, key_of, overrides_in
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir, config_dirs_in
from marl_cli.config.validate import check_overrides

FIRST_RUN = "experiment=embedded"
"""The experiment a command starts from unless it names one or loads a run."""
HINT = (" (marl {command} starts from experiment=embedded, 4x4 Plan-Path; add experiment=null to start from the bare "
        "group defaults)")
"""Ends a config error that the default experiment causes (``env=math`` meets its Plan-Path ``env.size``)."""


def with_default(command: str, args: list[str]) -> tuple[list[str], Callable[[], str] | None]:
    """``args`` starting from :data:`FIRST_RUN` unless they name an experiment (``experiment=null`` too: ``run_app``
    makes it Hydra's ``~experiment``) or continue or evaluate a run (which keeps its own); with the hint that ends
    a config error the default causes (None where the default does not apply)."""
    keys = {key_of(o) for o in overrides_in(args)}
    if keys & {"experiment", *LOADS_A_RUN}:
        return args, None
    return [FIRST_RUN, *args], default_hint(command, args)


def default_hint(command: str, args: list[str]) -> Callable[[], str]:
    """:data:`HINT` if ``args`` pick a group option (``env=math``) and check without the default experiment (so
    the default is what does not fit them)."""

    def hint() -> str:
        if not any("." not in key_of(o) and (config_dir() / key_of(o)).is_dir() for o in overrides_in(args)):
            return ""
        try:
            check_overrides(command, ["~experiment", *overrides_in(args)], config_dirs_in(args))
        except ConfigError:
            return ""
        return HINT.format(command=command)

    return hint
