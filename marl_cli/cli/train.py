"""``marl train``: the Hydra app over ``conf/train.yaml``, started from ``experiment=embedded`` unless the command
line names an experiment (``experiment=null``: the bare group defaults) or resumes a run (which keeps its own)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from marl_cli.cli.app import hydra_quote, key_of, overrides_in, run_app, run_job
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir, config_dirs_in
from marl_cli.config.validate import check_overrides


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    """Train one run in Hydra's run dir; return the final eval success (the metric sweepers optimise)."""
    from marl_cli.training.loop import train

    return run_job("train", train, cfg)


FIRST_RUN = "experiment=embedded"
"""What ``marl train`` starts from: the README's first run, which learns on a laptop CPU."""
HINT = (" (marl train starts from experiment=embedded, 4x4 Plan-Path; add experiment=null to start from the bare "
        "group defaults)")
"""Ends a config error that the default experiment causes (``env=math`` meets its Plan-Path ``env.size``)."""


def with_default(args: list[str]) -> list[str]:
    """``args`` starting from :data:`FIRST_RUN` unless they name an experiment (``experiment=null`` too: ``run_app``
    makes it Hydra's ``~experiment``) or resume a run."""
    keys = {key_of(o) for o in overrides_in(args)}
    if keys & {"experiment", "trainer.resume"}:
        return args
    return [FIRST_RUN, *args]


def default_hint(args: list[str]) -> Callable[[], str]:
    """:data:`HINT` if ``args`` pick a group option (``env=math``) and check without the default experiment (so
    the default is what does not fit them)."""

    def hint() -> str:
        if not any("." not in key_of(o) and (config_dir() / key_of(o)).is_dir() for o in overrides_in(args)):
            return ""
        try:
            check_overrides("train", ["~experiment", *overrides_in(args)], config_dirs_in(args))
        except ConfigError:
            return ""
        return HINT

    return hint


def resumed_in_place(args: list[str]) -> list[str]:
    """A resume (``trainer.resume=<run dir>``) continues in its run dir: Hydra writes its config and log there
    instead of making a new run dir (unless ``hydra.run.dir`` or ``-m`` says otherwise)."""
    overrides = overrides_in(args)
    resume = [o for o in overrides if key_of(o) == "trainer.resume" and "=" in o]
    given = any(key_of(o) == "hydra.run.dir" for o in overrides) or {"-m", "--multirun"} & set(args)
    if not resume or given:
        return []
    try:
        where = OverridesParser.create().parse_override(resume[0]).value()  # unquoted: 'multirun/a=1,b=2/seed=0'
    except HydraException:
        return []  # the override check says what is wrong with it
    return [f"hydra.run.dir={hydra_quote(str(Path(where).expanduser().resolve()))}"] if where else []


def run(args: list[str]) -> None:
    started = with_default(args)
    hint = default_hint(args) if started[0] == FIRST_RUN else None
    run_app("train", "train", train_app, [*started, *resumed_in_place(args)], hint)
