"""Where a training step's rows come from: rollouts of this step's tasks, or (decoupled sub trainer) the store.

Every source answers ``rows(step, rng) -> (samples, rollouts per task or None, metrics)`` and hears the fit
loop's other points (``start`` on a fresh run, ``after_update``, ``in_flight`` and ``saved`` around a checkpoint,
``restored``, ``finish``, ``close``), so the fit loop never branches on where rows come from: ``AsyncRows`` plays
them on a rollout worker process ahead of the learner (``trainer.max_staleness``, ``training/rows/rollout_worker.py``);
the decoupled M-GRPO exchange (``training/rows/decoupled.py``) lives in ``MainRows`` (rollouts that meet the sub
trainer's weights and hand it their sub-trajectories) and ``StoreRows`` (the sub trainer's rows, read from the
store). ``row_source`` picks the source of a run.
"""

from __future__ import annotations

import random
import time
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import Policy
from marl_cli.rollout.engine import RolloutResult, rollout_metrics, row_metrics
from marl_cli.training.build import Run
from marl_cli.training.rows.decoupled import Exchange
from marl_cli.training.rows.distributed import gathered
from marl_cli.training.rows.rollout_worker import Played, RolloutWorker, step_tasks

Rows = tuple[list[Sample], dict[int, list[int]] | None, dict[str, float]]


class RolloutRows:
    """Rollouts of the step's training tasks (``rollout.tasks_per_step`` of them, K samples each), dealt to
    the run's processes and gathered.

    Attributes:
        plays: this trainer plays episodes (so it warm-starts and evaluates).
        save_every: the checkpoint cadence when ``trainer.save_every`` is 0 (0: only at the end).
    """

    plays = True
    save_every = 0

    def __init__(self, run: Run):
        self.run = run

    def rows(self, step: int, rng: random.Random) -> Rows:
        run, cfg = self.run, self.run.cfg
        metrics = self.before_rollout(step)
        tasks = step_tasks(run.workflow, step, cfg.rollout.tasks_per_step)

        def play(mine: list) -> RolloutResult:
            return run.rollout.play(mine, cfg.algorithm.num_generations, rng)

        result = run.play(tasks, play)
        run.staleness.stamp(result.samples, step - 1)  # played from the newest weights
        rng.setstate(run.world.from_main(rng.getstate()))  # the ranks shuffle and select alike from here on
        metrics.update(rollout_metrics(result, "train", self.run.workflow))
        metrics.update(self.after_rollout(step, result.samples))
        return result.samples, None, metrics

    def before_rollout(self, step: int) -> dict[str, float]:
        """Metrics of what happens before step ``step``'s rollout (nothing here)."""
        return {}

    def after_rollout(self, step: int, samples: list[Sample]) -> dict[str, float]:
        """Metrics of what happens to step ``step``'s rows once played (nothing here)."""
        return {}

    def start(self, policies: dict[str, Policy]) -> None:
        """A fresh run's first contact with whatever the rows come from (nothing for plain rollouts)."""

    def after_update(self, step: int) -> None:
        """Rollouts need nothing after an update (the policies are updated in place)."""

    def in_flight(self, step: int) -> dict[int, Any]:
        """What a checkpoint of ``step`` must hold of rows already played for later steps, by step (none)."""
        return {}

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` is written (nothing to do)."""

    def restored(self, step: int, in_flight: dict[int, Any] | None = None) -> None:
        """The run resumed after ``step`` with the checkpoint's rows played ahead (ignored: rollouts play each step
        when it comes)."""

    def finish(self, step: int) -> None:
        """After the last step (nothing to do)."""

    def close(self) -> None:
        """The run ends (nothing to release)."""

    def report(self, counters: dict[str, float]) -> dict[str, float]:
        """The run's counters this source adds to each step's metrics and to the summary (none)."""
        return {}

    def why_empty(self, metrics: dict[str, float]) -> str:
        """What to add to the warning that a policy had nothing to train on (nothing)."""
        return ""


class AsyncRows(RolloutRows):
    """Rollouts played ahead by a rollout worker process (``trainer.max_staleness`` > 0): step s from the
    weights after update max(0, s − 1 − k), while the learner trains the steps before it
    (``training/rows/rollout_worker.py``). A checkpoint holds the steps played ahead, so a resume is exact."""

    def __init__(self, run: Run):
        super().__init__(run)
        self.worker: RolloutWorker | None = None
        self.ahead: dict[int, Played] = {}  # steps played for later, by step (this process's share)

    def rows(self, step: int, rng: random.Random) -> tuple[list[Sample], None, dict[str, float]]:
        t0 = time.perf_counter()
        played = self.ahead.pop(step, None) or self.worker.receive(step)
        metrics = {"async/wait_s": time.perf_counter() - t0, "async/worker_rollout_s": played.seconds}
        result = gathered(self.run.world, played.result)
        metrics.update(rollout_metrics(result, "train", self.run.workflow))
        return result.samples, None, metrics

    def start(self, policies: dict[str, Policy]) -> None:
        self.worker = RolloutWorker(self.run, 0, 1)

    def after_update(self, step: int) -> None:
        """Send the worker the weights of update ``step``."""
        self.worker.send(step, self.run.policies)

    def in_flight(self, step: int) -> dict[int, Played]:
        """The steps after ``step`` the worker has played or is playing: ``max_staleness`` of them (waited for)."""
        last = min(step + self.run.staleness.max_staleness, self.run.cfg.trainer.steps)
        for later in range(step + 1, last + 1):
            if later not in self.ahead:
                self.ahead[later] = self.worker.receive(later)
        return dict(self.ahead)

    def restored(self, step: int, in_flight: dict[int, Any] | None = None) -> None:
        """Go on from the checkpoint's steps played ahead (this process's share); the worker plays the rest."""
        parts = (in_flight or {}).get("ranks") or [{}] * self.run.world.size
        if len(parts) != self.run.world.size:
            raise ConfigError(f"the checkpoint after step {step} holds rows played ahead by {len(parts)} processes' "
                              f"rollout workers: resume it with {len(parts)} processes")
        self.ahead = dict(parts[self.run.world.rank])
        self.worker = RolloutWorker(self.run, step, step + len(self.ahead) + 1)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()


class MainRows(RolloutRows):
    """A decoupled main trainer's rollouts (``trainer.role=main``): before each it loads the sub policy's newest
    weights (at most ``trainer.max_staleness`` updates behind), after it hands the rollout's sub-trajectories to
    the store; with ``max_staleness=0`` it loads the sub policy trained on the last step before the final
    evaluation."""

    def __init__(self, run: Run, exchange: Exchange):
        super().__init__(run)
        self.exchange = exchange

    def before_rollout(self, step: int) -> dict[str, float]:
        return self.exchange.refresh(self.run.policies, step)

    def after_rollout(self, step: int, samples: list[Sample]) -> dict[str, float]:
        self.run.staleness.stamp((s for s in samples if s.role in self.exchange.sub_roles), self.exchange.loaded)
        return self.exchange.send(step, samples)

    def start(self, policies: dict[str, Policy]) -> None:
        """Claim the store namespace and publish the sub policy it starts with."""
        self.exchange.start(policies)

    def finish(self, step: int) -> None:
        if self.run.staleness.max_staleness == 0:  # the evaluation plays as the step after the last
            self.exchange.refresh(self.run.policies, step + 1)

    def close(self) -> None:
        self.exchange.store.close()

    def report(self, counters: dict[str, float]) -> dict[str, float]:
        return counters


class StoreRows(MainRows):
    """A decoupled sub trainer's rows (``trainer.role=sub``): the sub-trajectories the main trainer stored for the
    step, rescored with this trainer's reward coefficients; after each update it publishes its weights, and a
    step's items are acknowledged once a checkpoint holds its update (so it checkpoints every step by default).
    It plays no episodes: no warm start, no evaluation."""

    plays = False
    save_every = 1

    def __init__(self, run: Run, exchange: Exchange):
        super().__init__(run, exchange)
        self.acked = 0  # the last step whose items are acknowledged

    def rows(self, step: int, rng: random.Random) -> Rows:
        samples, rollouts, metrics = self.exchange.receive(step)
        self.run.workflow.rescore(samples)
        metrics.update(row_metrics(samples, "train"))
        return samples, rollouts, metrics

    def start(self, policies: dict[str, Policy]) -> None:
        """Wait for the main trainer's starting sub weights and start from them."""
        self.exchange.start(policies)

    def after_update(self, step: int) -> None:
        self.exchange.publish(step, self.run.policies)

    def saved(self, step: int) -> None:
        self.exchange.acknowledge(range(self.acked + 1, step + 1))
        self.acked = step

    def restored(self, step: int, in_flight: dict[int, Any] | None = None) -> None:
        """A crash between a checkpoint and its acknowledgement leaves its steps unacknowledged: acknowledge them."""
        self.exchange.acknowledge(range(1, step + 1))
        self.acked = step

    def finish(self, step: int) -> None:
        """The sub trainer's last weights are already published."""

    def why_empty(self, metrics: dict[str, float]) -> str:
        return f"; the main trainer stored {metrics.get('store/read', 0.0):.0f} sub-trajectories for this step"


def row_source(run: Run, exchange: Exchange | None = None) -> RolloutRows:
    """The rows of a run: plain rollouts, or a decoupled trainer's side of the ``exchange`` (by its role)."""
    if exchange is None:
        return AsyncRows(run) if run.staleness.max_staleness else RolloutRows(run)
    return StoreRows(run, exchange) if exchange.role == "sub" else MainRows(run, exchange)
