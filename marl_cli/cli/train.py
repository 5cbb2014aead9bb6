"""``marl train``: the Hydra app over ``conf/train.yaml``."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from marl_cli.cli.app import run_app, run_job
from marl_cli.config.paths import config_dir


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    """Train one run in Hydra's run dir; return the final eval success (the metric sweepers optimise)."""
    from marl_cli.training.loop import train

    return run_job("train", train, cfg)


FIRST_RUN = "experiment=embedded"
"""What plain ``marl train`` runs: the README's first run, which learns on a laptop CPU."""


def run(args: list[str]) -> None:
    if not args:
        print(f"marl train: no overrides given, running {FIRST_RUN} (marl train --help lists the config groups)",
              file=sys.stderr)
        args = [FIRST_RUN]
    run_app("train", "train", train_app, args)
