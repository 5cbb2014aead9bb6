"""A replay buffer of utterance-level transitions for off-policy critics (ArCHer): what a transition holds, FIFO
eviction at capacity, uniform sampling with replacement, the age of what is stored or drawn, and an exact
state for checkpoints.

Sampling draws each item independently and uniformly from the stored ones (with replacement), as ArCHer's
``ReplayBuffer.sample`` (YifeiZhou02/ArCHer, archer/data/utils.py: ``np.random.randint(0, size)``, called once per
item of a critic batch): the draws are i.i.d., so a mini-batch is an unbiased estimate of the mean loss over the
buffer, and a batch may be larger than the buffer (early in training). Unlike ArCHer's index
``randint(0, size) % capacity``, which favours the oldest slots once the buffer has wrapped, every stored item is
equally likely.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from typing import Any

from marl_cli.algorithms.values import Transition


class ReplayBuffer:
    """The last ``capacity`` transitions added, oldest first."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a replay buffer needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        self._items: list[Transition] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, transitions: Iterable[Transition]) -> None:
        """Append ``transitions`` in order; the oldest beyond ``capacity`` are evicted (FIFO)."""
        self._items.extend(transitions)
        del self._items[:max(len(self._items) - self.capacity, 0)]

    def sample(self, n: int, rng: random.Random) -> list[Transition]:
        """``n`` transitions drawn uniformly with replacement by ``rng`` (see the module's docstring)."""
        if n and not self._items:
            raise ValueError("cannot sample from an empty replay buffer")
        return rng.choices(self._items, k=n)

    def ages(self, step: int, items: Sequence[Transition] | None = None) -> dict[str, float]:
        """``age/mean`` and ``age/max`` of ``items`` (default: every stored one) at RL step ``step``, the age being
        ``step`` − the step a transition was collected at; {} without items."""
        ages = [step - t.step for t in (self._items if items is None else items)]
        if not ages:
            return {}
        return {"age/mean": sum(ages) / len(ages), "age/max": float(max(ages))}

    def state_dict(self) -> dict[str, Any]:
        """The stored transitions as plain data (lists, numbers, strings), oldest first."""
        return {"capacity": self.capacity, "transitions": [dataclasses.asdict(t) for t in self._items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold ``state_dict``'s transitions (the newest ``capacity`` of them, should the capacity have shrunk)."""
        self._items = []
        self.add(Transition(**item) for item in state["transitions"])
