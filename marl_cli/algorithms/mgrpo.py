"""M-GRPO: hierarchical advantages with trajectory alignment (arXiv 2511.13288; DESIGN §3).

A *trajectory* is the rows of one role in one rollout (``segment`` numbers a sub-agent's several
invocations in a rollout); every row of a trajectory carries the trajectory's reward and gets its
advantage, so all of an agent's tokens in it share one value.

Main (every role not in ``aligned_roles``): group = query over its K rollouts,
    A = (R − μ) / (σ + ε)                   (or R − μ with ``norm_by_std=False``).
Sub (``aligned_roles``): the d sub-trajectories of each rollout are aligned to exactly D:
    d < D   append D − d copies drawn uniformly from the rollout's own sub-trajectories
    d > D   keep a uniformly random subset of D (d − D dropped)
    d = 0   draw D uniformly from the sub-trajectories of the query's other rollouts
    a query with no sub-trajectory at all contributes none (counted as skipped)
so every query that has one yields D·K sub-samples; group = query over them, A as above, where
a copy counts as a sample of its own.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.grpo import GroupConfig, group_advantages
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import bounded
from marl_cli.core.samples import Sample


@dataclass
class MGRPOConfig(GroupConfig):
    """M-GRPO: the group normalisation of GRPO on whole trajectories, the sub-agents' aligned to D per rollout."""

    align_d: int = bounded(8, ge=1)  # D, sub-trajectories per rollout after alignment (D·K per query)
    aligned_roles: list[str] = field(default_factory=lambda: ["sub"])  # roles aligned to D per rollout

T = TypeVar("T")


@dataclass(frozen=True)
class Trajectory:
    """The rows of one role's trajectory: (task, branch) is the rollout, ``segment`` the invocation in it."""

    task: int
    branch: int
    role: str
    segment: int
    rows: tuple[Sample, ...]

    @property
    def reward(self) -> float:
        return self.rows[0].reward


@dataclass
class Alignment:
    """The aligned sub-trajectories of one query, rollout by rollout, and what alignment did."""

    rollouts: dict[int, list] = field(default_factory=dict)
    d: list[int] = field(default_factory=list)  # sub-trajectories per rollout before alignment
    duplicated: int = 0  # copies appended (d < D) or drawn from the query (d = 0)
    dropped: int = 0  # sub-trajectories left out (d > D)
    filled: int = 0  # rollouts with d = 0 filled from the query
    skipped: bool = False  # the query had no sub-trajectory at all


def align(by_rollout: dict[int, Sequence[T]], d_target: int, rng: random.Random) -> Alignment:
    """Align every rollout of one query to exactly ``d_target`` sub-trajectories (rules in the module doc)."""
    if d_target < 1:
        raise ConfigError(f"algorithm.align_d must be at least 1, got {d_target}")
    out = Alignment(d=[len(v) for v in by_rollout.values()])
    pool = [t for items in by_rollout.values() for t in items]
    if not pool:
        out.skipped = True
        return out
    for rollout, items in by_rollout.items():
        items = list(items)
        if not items:
            out.rollouts[rollout] = [rng.choice(pool) for _ in range(d_target)]
            out.duplicated += d_target
            out.filled += 1
        elif len(items) > d_target:
            out.rollouts[rollout] = rng.sample(items, d_target)
            out.dropped += len(items) - d_target
        else:
            extra = d_target - len(items)
            out.rollouts[rollout] = items + [rng.choice(items) for _ in range(extra)]
            out.duplicated += extra
    return out


def trajectories(samples: Sequence[Sample]) -> list[Trajectory]:
    """The sample rows grouped into trajectories, in order of first appearance."""
    rows: dict[tuple[int, int, str, int], list[Sample]] = defaultdict(list)
    for s in samples:
        rows[s.task, s.branch, s.role, s.segment].append(s)
    return [Trajectory(task, branch, role, segment, tuple(r)) for (task, branch, role, segment), r in rows.items()]


def mgrpo_advantages(samples: Sequence[Sample], d_target: int, aligned_roles: Sequence[str],
                     norm_by_std: bool = True, eps: float = 1e-6, filter: str = "none",
                     rng: random.Random | None = None,
                     rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """The training rows (copies with advantages; aligned roles duplicated or dropped) and alignment statistics.

    ``rollouts`` lists each task's rollouts (branches) when ``samples`` may not show them all (rows of the
    sub-agent alone, as a decoupled sub trainer has them); by default they are read off ``samples``.
    ``filter="zero_std"`` marks the rows of groups whose rewards are all equal as not kept.
    """
    rng = rng or random.Random(0)
    trajs = trajectories(samples)
    if rollouts is None:
        rollouts = defaultdict(list)
        for s in samples:
            if s.branch not in rollouts[s.task]:
                rollouts[s.task].append(s.branch)
    out: list[Sample] = []
    stats: dict[str, float] = {}
    for role in sorted({t.role for t in trajs}):
        mine = [t for t in trajs if t.role == role]
        if role in aligned_roles:
            members, role_stats = _aligned(mine, rollouts, d_target, rng)
        else:
            members, role_stats = [(t.task, t) for t in mine], {}
        rewards = [t.reward for _, t in members]
        advantages = group_advantages(rewards, [task for task, _ in members], norm_by_std, eps)
        spread: dict[int, set[float]] = defaultdict(set)
        for (task, _), r in zip(members, rewards, strict=True):
            spread[task].add(r)
        for (task, traj), a in zip(members, advantages, strict=True):
            keep = filter == "none" or len(spread[task]) > 1
            out.extend(replace(row, advantage=a, keep=keep) for row in traj.rows)
        stats[f"{role}/trajectories"] = float(len(mine))
        stats[f"{role}/trajectory_reward"] = sum(t.reward for t in mine) / max(len(mine), 1)
        stats[f"{role}/zero_std_fraction"] = sum(len(v) == 1 for v in spread.values()) / max(len(spread), 1)
        stats.update({f"{role}/{k}": v for k, v in role_stats.items()})
    return out, stats


def _aligned(trajs: list[Trajectory], rollouts: dict[int, list[int]], d_target: int,
             rng: random.Random) -> tuple[list[tuple[int, Trajectory]], dict[str, float]]:
    """Every query's aligned sub-trajectories as (task, trajectory) members, and the alignment metrics."""
    by_task: dict[int, dict[int, list[Trajectory]]] = {task: {b: [] for b in branches}
                                                       for task, branches in rollouts.items()}
    for t in trajs:
        by_task[t.task][t.branch].append(t)
    members: list[tuple[int, Trajectory]] = []
    d: list[int] = []
    counts = {"duplicated": 0, "dropped": 0, "filled": 0, "skipped_queries": 0}
    for task, by_rollout in by_task.items():
        result = align(by_rollout, d_target, rng)
        d += result.d
        counts["duplicated"] += result.duplicated
        counts["dropped"] += result.dropped
        counts["filled"] += result.filled
        counts["skipped_queries"] += result.skipped
        members += [(task, t) for items in result.rollouts.values() for t in items]
    stats = {k: float(v) for k, v in counts.items()}
    stats["d_mean"] = sum(d) / max(len(d), 1)
    stats["d_max"] = float(max(d, default=0))
    stats["d_over_D"] = sum(x > d_target for x in d) / max(len(d), 1)
    stats["aligned"] = float(len(members))
    return members, stats


def mgrpo_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                    rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """M-GRPO: trajectory-level advantages, the sub-agents' trajectories aligned to D per rollout."""
    return mgrpo_advantages(samples, cfg.align_d, cfg.aligned_roles, cfg.norm_by_std, cfg.std_eps, cfg.filter,
                            rng, rollouts)


def mgrpo_label(key: Callable[[str], Any], single: bool) -> str:
    """M-GRPO's row in the paper's tables, naming the roles kept frozen."""
    frozen = key("trainer.frozen_roles") or []
    return "M-GRPO" + (", frozen " + ", ".join(map(str, frozen)) if frozen else "")


ALGORITHMS.register("m_grpo", schema=MGRPOConfig)(Algorithm(mgrpo_estimator, hierarchical=True, label=mgrpo_label))
