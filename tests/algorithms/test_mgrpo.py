"""M-GRPO: trajectory alignment and hierarchical advantages against hand-computed values."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from marl_cli.algorithms.mgrpo import align, mgrpo_advantages, trajectories
from marl_cli.config.errors import ConfigError
from marl_cli.core.samples import Sample


def row(task: int, branch: int, role: str, reward: float, segment: int = 0, turn: int = 0) -> Sample:
    return Sample(task=task, branch=branch, turn=turn, role=role, policy=role, prompt_ids=[1], completion_ids=[2],
                  reward=reward, segment=segment)


@pytest.mark.parametrize("seed", range(30))
def test_alignment_yields_exactly_d_per_rollout_from_the_right_places(seed: int) -> None:
    rng = random.Random(seed)
    d_target, k = rng.randint(1, 6), rng.randint(1, 6)
    counts = [rng.choice([0, 0, 1, d_target, d_target + rng.randint(1, 5), rng.randint(0, 2 * d_target)])
              for _ in range(k)]
    by_rollout = {b: [(b, j) for j in range(n)] for b, n in enumerate(counts)}
    result = align(by_rollout, d_target, random.Random(seed))
    if sum(counts) == 0:
        assert result.skipped and not result.rollouts
        return
    assert sum(len(v) for v in result.rollouts.values()) == d_target * k
    for b, n in enumerate(counts):
        chosen = result.rollouts[b]
        assert len(chosen) == d_target
        if n == 0:  # filled from the query's other rollouts
            assert all(owner != b for owner, _ in chosen)
            continue
        assert all(owner == b for owner, _ in chosen)  # duplicates and survivors come only from the rollout itself
        if n >= d_target:  # nothing duplicated: a subset (all of them when n == D)
            assert len(set(chosen)) == d_target
        else:  # every own sub-trajectory kept, the rest copies of them
            assert set(chosen) == set(by_rollout[b])
    assert result.dropped == sum(max(n - d_target, 0) for n in counts)
    assert result.duplicated == sum(d_target - n if n else d_target for n in counts if n < d_target)
    assert result.filled == counts.count(0)


def test_dropped_subset_is_uniformly_random() -> None:
    rng = random.Random(0)
    kept: Counter = Counter()
    trials = 4000
    for _ in range(trials):
        kept.update(align({0: list(range(10))}, 4, rng).rollouts[0])
    for item in range(10):  # each survives with probability D/d = 0.4
        assert abs(kept[item] / trials - 0.4) < 0.04


def test_fill_draws_uniformly_from_the_query() -> None:
    rng = random.Random(1)
    drawn: Counter = Counter()
    for _ in range(3000):
        drawn.update(align({0: ["a", "b"], 1: ["c"], 2: []}, 2, rng).rollouts[2])
    assert set(drawn) == {"a", "b", "c"}
    assert max(drawn.values()) / min(drawn.values()) < 1.2


def test_align_d_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="align_d"):
        align({0: [1]}, 0, random.Random(0))


def test_hand_computed_main_and_sub_advantages() -> None:
    samples = [
        # query 0, rollout 0: two main turns (R_M = 1.0), two sub-calls (R_S = 0.6 and 1.0), the second of two turns
        row(0, 0, "main", 1.0, turn=0), row(0, 0, "sub", 0.6, 0, turn=1), row(0, 0, "main", 1.0, turn=2),
        row(0, 0, "sub", 1.0, 1, turn=3), row(0, 0, "sub", 1.0, 1, turn=4),
        # query 0, rollout 1: one main turn (R_M = 0.1), one sub-call (R_S = 0.1)
        row(0, 1, "main", 0.1), row(0, 1, "sub", 0.1, 0, turn=1),
    ]
    rows, stats = mgrpo_advantages(samples, d_target=2, aligned_roles=["sub"], eps=0.0, rng=random.Random(0))
    main = {(s.branch, s.turn): s.advantage for s in rows if s.role == "main"}
    # main group = query over K = 2 rollouts: mean 0.55, sample std sqrt(2 · 0.45²) = 0.6364
    assert main[0, 0] == pytest.approx(0.45 / math.sqrt(2 * 0.45 ** 2)) == main[0, 2]
    assert main[1, 0] == pytest.approx(-0.45 / math.sqrt(2 * 0.45 ** 2))
    # sub: rollout 0 keeps its two calls, rollout 1's one call is duplicated → [0.6, 1.0, 0.1, 0.1]
    mean = 0.45
    std = math.sqrt((0.15 ** 2 + 0.55 ** 2 + 0.35 ** 2 + 0.35 ** 2) / 3)
    sub = [(s.branch, s.segment, s.turn, s.advantage) for s in rows if s.role == "sub"]
    assert sorted(sub) == sorted([
        (0, 0, 1, pytest.approx((0.6 - mean) / std)),
        (0, 1, 3, pytest.approx((1.0 - mean) / std)), (0, 1, 4, pytest.approx((1.0 - mean) / std)),
        (1, 0, 1, pytest.approx((0.1 - mean) / std)), (1, 0, 1, pytest.approx((0.1 - mean) / std)),
    ])
    assert stats["sub/duplicated"] == 1 and stats["sub/dropped"] == 0 and stats["sub/aligned"] == 4
    assert stats["sub/d_mean"] == 1.5 and stats["sub/d_max"] == 2 and stats["sub/d_over_D"] == 0
    assert stats["main/trajectories"] == 2 and stats["sub/trajectories"] == 3
    assert all(s.advantage == 0.0 for s in samples)  # the input rows are left as they were


def test_query_without_sub_trajectories_is_skipped_and_counted() -> None:
    samples = [row(0, 0, "main", 0.0), row(0, 1, "main", 0.1), row(1, 0, "main", 1.0), row(1, 0, "sub", 0.5),
               row(1, 1, "main", 0.1), row(1, 1, "sub", 0.0, 0), row(1, 1, "sub", 0.9, 1), row(1, 1, "sub", 0.2, 2)]
    rows, stats = mgrpo_advantages(samples, d_target=2, aligned_roles=["sub"], rng=random.Random(3))
    sub = [s for s in rows if s.role == "sub"]
    assert all(s.task == 1 for s in sub) and len(sub) == 4  # D·K = 2·2 for query 1, none for query 0
    assert stats["sub/skipped_queries"] == 1 and stats["sub/dropped"] == 1 and stats["sub/d_over_D"] == 0.25
    assert stats["sub/d_max"] == 3


def test_rollouts_given_explicitly_cover_rollouts_without_rows() -> None:
    """A decoupled sub trainer sees only sub rows; rollouts with d = 0 come from the step's record."""
    samples = [row(0, 0, "sub", 1.0), row(0, 0, "sub", 0.0, 1)]
    rows, stats = mgrpo_advantages(samples, 2, ["sub"], rng=random.Random(0), rollouts={0: [0, 1, 2]})
    assert len(rows) == 6 and stats["sub/filled"] == 2 and stats["sub/d_mean"] == pytest.approx(2 / 3)


def test_zero_std_filter_and_single_role_is_trajectory_grpo() -> None:
    samples = [row(0, b, "agent", r, turn=t) for b, r in enumerate([1.0, 0.0, 1.0]) for t in range(2)]
    samples += [row(1, b, "agent", 0.1) for b in range(3)]
    rows, _ = mgrpo_advantages(samples, 8, ["sub"], filter="zero_std")
    by_task = {t: [s for s in rows if s.task == t] for t in (0, 1)}
    assert all(s.keep for s in by_task[0]) and not any(s.keep for s in by_task[1])
    adv = {s.branch: s.advantage for s in by_task[0]}
    assert adv[0] == adv[2] > 0 > adv[1]
    assert len(trajectories(samples)) == 6
