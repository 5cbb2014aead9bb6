"""``marl eval``: the Hydra app over ``conf/eval.yaml``, started from the first run (``cli.first_run``) unless the
command line names an experiment or loads a run (``load=``, which keeps the run's own config)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from marl_cli.cli.app import run_app, run_job
from marl_cli.cli.first_run import with_default
from marl_cli.config.paths import config_dir


@hydra.main(config_path=str(config_dir()), config_name="eval", version_base="1.3")
def eval_app(cfg: DictConfig) -> float | None:
    """Evaluate in Hydra's run dir; return the success rate (the metric sweepers optimise)."""
    from marl_cli.training.evaluation import run_evaluation

    return run_job("eval", run_evaluation, cfg)


def run(args: list[str]) -> None:
    started, hint = with_default("eval", args)
    run_app("eval", "eval", eval_app, started, hint)
