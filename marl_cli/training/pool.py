"""An opponent pool: the learner plays against frozen snapshots of itself (``pool.every`` > 0).

Two roles act through two policies of one model (``policy=per_role``): ``pool.learner`` trains, ``pool.opponent``
is frozen (``trainer.frozen_roles``) and plays, at each step, one snapshot of the learner from the pool. Before the
first step the pool holds the learner as it starts (step 0) and the opponent plays it; after every ``pool.every``
steps the learner's trained weights (``Policy.trained_state``: a full model, or an adapter's weights) join the pool as
``pool/step_<s>.pt`` in the run dir, the oldest leaving beyond ``pool.size``. After each step the next step's
opponent is drawn from the pool: ``uniform`` (every snapshot alike) or ``recency`` (the i-th newest with weight
2^-i: the newest half the time). The draw's generator is a function of (run seed, step), and a resume drops the
snapshots newer than its checkpoint and draws its first step's opponent again, so a resumed run plays the same
opponents as an uninterrupted one. Each step logs ``pool/size`` and ``pool/opponent_step`` (the
snapshot the next step plays).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch

from marl_cli.core.samples import Sample
from marl_cli.training.hooks import FitLoop, Hook

log = logging.getLogger(__name__)


class OpponentPool(Hook):
    """Snapshots of ``pool.learner``'s policy, one of which ``pool.opponent``'s policy plays each step."""

    def __init__(self, where: Path, learner: str, opponent: str, every: int, size: int, sample: str, seed: int):
        self.dir = where
        self.learner, self.opponent = learner, opponent
        self.every, self.size, self.sample, self.seed = every, size, sample, seed

    def snapshots(self) -> list[int]:
        """The steps in the pool, oldest first."""
        return sorted(int(p.stem.removeprefix("step_")) for p in self.dir.glob("step_*.pt"))

    def add(self, trainer: FitLoop, step: int) -> None:
        """The learner's weights after ``step`` join the pool (written whole, then renamed); the oldest beyond the
        pool's size leave it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in trainer.run.policies[self.learner].trained_state().items()}
        tmp = self.dir / f"step_{step:06d}.tmp"
        torch.save(state, tmp)
        tmp.rename(tmp.with_suffix(".pt"))
        for old in self.snapshots()[:-self.size]:
            (self.dir / f"step_{old:06d}.pt").unlink()

    def draw(self, step: int) -> int:
        """The snapshot step ``step`` plays against."""
        steps = self.snapshots()
        rng = random.Random(f"marl-pool/{self.seed}/{step}")
        if self.sample == "uniform":
            return rng.choice(steps)
        weights = [2.0 ** -(len(steps) - 1 - i) for i in range(len(steps))]
        return rng.choices(steps, weights)[0]

    def play(self, trainer: FitLoop, step: int, metrics: dict[str, float] | None = None) -> None:
        """Load the snapshot drawn for ``step`` into the opponent's policy."""
        chosen = self.draw(step)
        state = torch.load(self.dir / f"step_{chosen:06d}.pt", weights_only=True)
        trainer.run.policies[self.opponent].load_trained_state(state)
        if metrics is not None:
            metrics.update({"pool/size": float(len(self.snapshots())), "pool/opponent_step": float(chosen)})

    def on_start(self, trainer: FitLoop) -> None:
        """A fresh run puts the learner as it starts in the pool; a resume drops the snapshots its checkpoint did
        not see. Then the first step's opponent is drawn."""
        for newer in (s for s in self.snapshots() if s > trainer.start):
            (self.dir / f"step_{newer:06d}.pt").unlink()
        if trainer.start == 0:
            self.add(trainer, 0)
        if trainer.start < trainer.cfg.trainer.steps:
            self.play(trainer, trainer.start + 1)
        log.info("opponent pool: %d snapshots of %s in %s; %s plays one each step (%s)", len(self.snapshots()),
                 self.learner, self.dir, self.opponent, self.sample)

    def on_step(self, trainer: FitLoop, step: int, metrics: dict[str, float], rows: list[Sample]) -> None:
        if step % self.every == 0:
            self.add(trainer, step)
        if step < trainer.cfg.trainer.steps:
            self.play(trainer, step + 1, metrics)


def opponent_pool(cfg: Any, run: Any) -> OpponentPool:
    """The pool ``cfg.pool`` describes over ``run``'s policies (each process of a run keeps its own copy)."""
    where = run.run_dir / "pool" if run.world.size == 1 else run.run_dir / "pool" / f"rank{run.world.rank}"
    return OpponentPool(where, run.role_map[cfg.pool.learner], run.role_map[cfg.pool.opponent], cfg.pool.every,
                        cfg.pool.size, cfg.pool.sample, cfg.seed)
