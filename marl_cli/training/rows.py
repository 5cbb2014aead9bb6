"""Where a training step's rows come from: rollouts of this step's tasks, or (decoupled sub trainer) the store.

Both sources answer ``rows(step, rng) -> (samples, rollouts per task or None, metrics)``, hear
``after_update(step)`` once the step's update is done and ``finish(step)`` after the last step, so
the fit loop never branches on the trainer's role.
"""

from __future__ import annotations

import random

from marl_cli.rollout.engine import RolloutResult, rollout_metrics, row_metrics, run_episodes
from marl_cli.rollout.samples import Sample
from marl_cli.training.build import Run
from marl_cli.training.decoupled import Exchange

Rows = tuple[list[Sample], dict[int, list[int]] | None, dict[str, float]]


class RolloutRows:
    """Rollouts of the step's training tasks (``rollout.tasks_per_step`` of them, K samples each), dealt to
    the run's processes and gathered.

    A decoupled main trainer (``exchange``) first loads the sub policy's newest weights and then hands
    the rollout's sub-trajectories to the store; synchronous, it loads the sub policy trained on the
    last step before the final evaluation.
    """

    def __init__(self, run: Run, exchange: Exchange | None = None):
        self.run = run
        self.exchange = exchange

    def rows(self, step: int, rng: random.Random) -> Rows:
        run, cfg = self.run, self.run.cfg
        metrics: dict[str, float] = {}
        if self.exchange is not None:
            metrics.update(self.exchange.refresh(run.policies, step - 1))
        per_step = cfg.rollout.tasks_per_step
        tasks = [run.workflow.env.task("train", (step - 1) * per_step + j) for j in range(per_step)]

        def play(mine: list) -> RolloutResult:
            return run_episodes(run.workflow, run.policies, run.routing, mine, cfg.algorithm.num_generations,
                                run.train_sampling, run.generator, cfg.algorithm.mode, cfg.algorithm.selection, rng)

        result = run.play(tasks, play)
        rng.setstate(run.world.from_main(rng.getstate()))  # the ranks shuffle and select alike from here on
        metrics.update(rollout_metrics(result, "train"))
        if self.exchange is not None:
            metrics.update(self.exchange.send(step, result.samples))
        return result.samples, None, metrics

    def after_update(self, step: int) -> None:
        """Rollouts need nothing after an update (the policies are updated in place)."""

    def finish(self, step: int) -> None:
        if self.exchange is not None and self.run.cfg.trainer.sync:
            self.exchange.refresh(self.run.policies, step)


class StoreRows:
    """A decoupled sub trainer's rows: the sub-trajectories the main trainer stored for the step,
    rescored with this trainer's reward coefficients; after each update it publishes its weights."""

    def __init__(self, run: Run, exchange: Exchange):
        self.run = run
        self.exchange = exchange

    def rows(self, step: int, rng: random.Random) -> Rows:
        samples, rollouts, metrics = self.exchange.receive(step)
        self.run.workflow.rescore(samples)
        metrics.update(row_metrics(samples, "train"))
        return samples, rollouts, metrics

    def after_update(self, step: int) -> None:
        self.exchange.publish(step, self.run.policies)

    def finish(self, step: int) -> None:
        """The sub trainer's last weights are already published."""
