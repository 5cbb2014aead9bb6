"""Data-parallel training across processes (``torchrun`` / ``accelerate launch``): a step's tasks dealt to the
ranks and their rows gathered (who a process is and the collectives: ``core/world.py``).

Every rank holds every policy (under ``trainer.sharding=fsdp2`` a whole copy to act with, the learner split
across the ranks: ``training/learner/sharding.py``). A step's tasks are dealt to the ranks (a task's K rollouts stay on
one rank, so groups stay whole), the rows are gathered so every rank holds the step's full table,
and each policy's update is data-parallel: every mini-batch is split across the ranks, each rank's
loss is weighted by its share of the mini-batch, and the gradients are averaged before the
optimiser step, so the ranks' weights stay identical and the update equals one process's on the same
rows. Rank 0 alone writes metrics, summaries, samples and checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marl_cli.core.world import World
from marl_cli.rollout.engine import RolloutResult


def play_shared(world: World, tasks: Sequence[Any], play: Callable[[list[Any]], RolloutResult]) -> RolloutResult:
    """``play`` this rank's share of ``tasks`` and gather every rank's episodes and rows, task indices
    renumbered to ``tasks``' (every rank returns the same result; one process plays them all)."""
    return gathered(world, renumbered(world, play(world.share(tasks))))


def renumbered(world: World, part: RolloutResult) -> RolloutResult:
    """This rank's ``part`` (played from ``world.share(tasks)``) with task indices renumbered to ``tasks``'."""
    if world.size > 1:
        for item in (*part.episodes, *part.samples):
            item.task = world.global_index(item.task)
    return part


def gathered(world: World, part: RolloutResult) -> RolloutResult:
    """Every rank's ``part`` (renumbered) as one result, the same on every rank."""
    if world.size == 1:
        return part
    parts = world.gather(part)
    return RolloutResult([s for p in parts for s in p.samples],
                         sorted((e for p in parts for e in p.episodes), key=lambda e: (e.task, e.branch)),
                         sum(p.generate_calls for p in parts))
