"""``marl train``: the Hydra app over ``conf/train.yaml``."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from marl_cli.cli.app import fail, run_app
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def train_app(cfg: DictConfig) -> float | None:
    """Train one run in Hydra's run dir; return the final eval success (the metric sweepers optimise)."""
    import datasets
    import transformers

    from marl_cli.training.loop import train

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    try:
        summary = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as exc:
        fail("train", str(exc))
    return summary.get("eval/success")


def run(args: list[str]) -> None:
    run_app("train", "train", train_app, args)
