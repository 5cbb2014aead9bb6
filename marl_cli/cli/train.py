"""``marl train``: the Hydra app over ``conf/train.yaml``, started from the first run (``cli.first_run``) unless
the command line names an experiment (``experiment=null``: the bare group defaults) or resumes a run (which keeps
its own)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from marl_cli.cli.app import hydra_quote, key_of, overrides_in, run_app, run_job
from marl_cli.cli.first_run import with_default
from marl_cli.config.paths import config_dir


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    """Train one run in Hydra's run dir; return the final eval success (the metric sweepers optimise)."""
    from marl_cli.training.loop import train

    return run_job("train", train, cfg)


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
    started, hint = with_default("train", args)
    run_app("train", "train", train_app, [*started, *resumed_in_place(args)], hint)
