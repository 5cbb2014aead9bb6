"""A key/value cache that grows in place, for the ``hf`` backend's decoding.

transformers' ``DynamicLayer`` appends each decoded token's keys and values by concatenation: every step copies
the layer's whole cache, so a completion of n tokens costs O(n²) copying, which dominates decoding on a CPU past
a few hundred tokens (≈ 70% of a 512-token rollout's time on the tiny model). ``GrowingLayer`` writes each step
into spare room at the end of a buffer and hands back a view of the filled part: the same keys and values, the
buffer doubling when full (up to the longest the generation can reach), so the copying is amortised O(1) per
token and the memory at most twice what is filled (what ``torch.cat`` holds for a moment every step).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with room to grow.

    Whatever rebinds ``keys`` to a tensor of its own (``batch_select_indices``, ``reorder_cache``, ``reset``,
    offloading) leaves the buffers behind; the next ``update`` copies the keys into new buffers. ``crop`` keeps a
    view of the buffers, and the next ``update`` overwrites what it cut.
    """

    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    limit: int | None = None
    """The most positions the layer will hold (a prompt's width plus the new tokens): no buffer grows past it."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._fits(key_states, value_states, end):
            doubled = 2 * length if self.limit is None else min(2 * length, self.limit)
            self._grow(key_states, value_states, length, max(end, doubled))
        keys, values = self.buffers
        keys[..., length:end, :] = key_states
        values[..., length:end, :] = value_states
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> bool:
        """Whether the buffers hold this layer's keys and values and have room up to ``end``."""
        if self.buffers is None:
            return False
        keys, values = self.buffers
        return (self.keys.data_ptr() == keys.data_ptr() and self.values.data_ptr() == values.data_ptr()
                and keys.shape[:2] == key_states.shape[:2] and values.shape[:2] == value_states.shape[:2]
                and keys.dtype == key_states.dtype and keys.shape[-2] >= end)

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        """New buffers of ``capacity`` positions, the first ``length`` holding this layer's keys and values."""
        grown = []
        for old, new in ((self.keys, key_states), (self.values, value_states)):
            buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
            if length:
                buffer[..., :length, :] = old
            grown.append(buffer)
        self.buffers = (grown[0], grown[1])


def grow_in_place(cache: Any, limit: int | None = None) -> Any:
    """``cache`` with each of its plain ``DynamicLayer`` layers turned into a ``GrowingLayer`` (its keys and values
    kept; sliding-window, static and other layers left as they are), for ``generate`` to decode into; ``limit``:
    the most positions it will hold."""
    for layer in getattr(cache, "layers", ()):
        if type(layer) is DynamicLayer:
            layer.__class__ = GrowingLayer
            layer.limit = limit
    return cache
