"""The replay buffer: FIFO eviction, uniform sampling with replacement, ages, and an exact state round trip."""

from __future__ import annotations

import pickle
import random

import pytest

from marl_cli.algorithms.values import Transition
from marl_cli.critics.replay import ReplayBuffer


def _transition(step: int, done: bool = False) -> Transition:
    return Transition(prompt_ids=[3, step + 4], completion_ids=[step + 5], reward=float(step), done=done,
                      next_prompt_ids=None if done else [step + 6], step=step, role="agent")


def _buffer(capacity: int, steps: range) -> ReplayBuffer:
    buffer = ReplayBuffer(capacity)
    buffer.add(_transition(s, done=s % 3 == 0) for s in steps)
    return buffer


def test_the_oldest_transitions_are_evicted_first():
    buffer = _buffer(3, range(2))
    assert len(buffer) == 2
    buffer.add([_transition(2), _transition(3), _transition(4)])
    assert len(buffer) == 3
    assert {t.step for t in buffer.sample(50, random.Random(0))} == {2, 3, 4}  # 0 and 1 are gone
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)


def test_sampling_is_uniform_with_replacement_and_follows_the_rng():
    buffer = _buffer(10, range(4))
    draws = buffer.sample(9, random.Random(1))
    assert len(draws) == 9 > len(buffer)  # with replacement: more draws than items
    assert draws == buffer.sample(9, random.Random(1))
    counts = [t.step for t in buffer.sample(4000, random.Random(2))]
    assert all(900 < counts.count(s) < 1100 for s in range(4))  # 1000 expected each (sd ≈ 27), a fixed seed
    assert buffer.sample(0, random.Random(0)) == []
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(2).sample(1, random.Random(0))


def test_ages_of_the_stored_and_of_the_drawn_transitions():
    buffer = _buffer(3, range(5))  # steps 2, 3, 4 stay
    assert buffer.ages(10) == {"age/mean": 7.0, "age/max": 8.0}
    assert buffer.ages(10, [_transition(9), _transition(9), _transition(3)]) == {"age/mean": 3.0, "age/max": 7.0}
    assert ReplayBuffer(2).ages(10) == {}


def test_a_restored_buffer_samples_what_the_original_samples():
    buffer = _buffer(4, range(7))
    state = pickle.loads(pickle.dumps(buffer.state_dict()))
    restored = ReplayBuffer(4)
    restored.load_state_dict(state)
    rng, rng2 = random.Random(3), random.Random(3)
    for _ in range(3):
        assert buffer.sample(5, rng) == restored.sample(5, rng2)
    buffer.add([_transition(7)])
    restored.add([_transition(7)])
    assert buffer.sample(20, rng) == restored.sample(20, rng2)
    smaller = ReplayBuffer(2)
    smaller.load_state_dict(state)
    assert [t.step for t in smaller.sample(30, random.Random(0))].count(3) == 0  # the newest 2 kept: 5, 6
