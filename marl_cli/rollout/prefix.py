"""Prompt-prefix sharing: rows of a batch that share a prompt (a group's K samples, a tree's branches) run
that prompt through the model once, for generation and for the learner's scoring alike."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class _PromptLayer(DynamicLayer):
    """The learner's prompt pass's cache layer: a write replaces what it holds. The pass writes each layer once; a
    backward that replays the layer (gradient checkpointing) writes the same keys again instead of appending them."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """Each row's copy of its prompt's keys and values, read-only: a forward over what follows attends to them
    and to its own keys and stores nothing, so a replay of it (gradient checkpointing) sees the same keys."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


@contextmanager
def keeping_cache(model: Any) -> Iterator[None]:
    """Inside it, layers that checkpoint their activations keep the cache they are given. transformers drops it
    (a backward replaying a layer would write its cache twice); the learner's caches (``replayable``) are written
    the same way by every replay, so its scoring shares prompts under gradient checkpointing too."""
    layers = [m for m in model.modules()
              if getattr(m, "gradient_checkpointing", False) is True and hasattr(m, "_can_checkpoint_with_cache")]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


def shared_prompt_cache(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, always: bool = False,
                        replayable: bool = False, mask_positions: bool = False) -> dict[str, Any] | None:
    """The key/value cache of every row's left-padded prompt but its last token, computed once per distinct
    prompt and copied to each row, as the keyword argument the model's forward (and ``generate``) takes it
    under; the caller feeds each row's last prompt token and what follows with it, at the full forward's
    positions and masks.

    ``replayable`` (the learner's scoring, run inside ``keeping_cache``): neither the prompt pass nor the
    caller's forward over the completions stores anything beyond the prompt, so a backward that replays a
    layer sees what the forward saw; generation instead gets a cache it can grow. ``model`` is a causal LM (only
    the last prompt position's logits are computed) or a bare decoder (a value model's trunk); ``mask_positions``
    numbers the prompt's positions by its real tokens (cumsum of the mask − 1), as the value model does.

    None when no two rows share a prompt (unless ``always``: generation runs every prompt this way), a prompt
    is a single token wide, or (``replayable``) the model's cache has layers other than plain ones (a sliding
    window): the caller then runs the plain forward.
    """
    width = prompt_ids.size(1)
    if width < 2:
        return None
    distinct, row_prompt = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    if len(distinct) == len(prompt_ids) and not always:
        return None
    name = cache_argument(model)
    given: dict[str, Any] = {}
    if replayable:
        given[name] = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in given[name].layers):
            return None
        given[name].layers = [_PromptLayer() for _ in given[name].layers]
    mask = distinct[:, width:2 * width - 1]
    if forward_takes(model, "logits_to_keep"):
        given["logits_to_keep"] = 1
    if mask_positions:
        given["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    prefix = model(input_ids=distinct[:, :width - 1], attention_mask=mask, use_cache=True, **given)
    cache = given[name] if replayable else prefix.get(name)  # the output names it as the forward does
    if cache is None or cache.get_seq_length() != width - 1:
        return None
    if replayable:  # index_select: its backward adds each row's gradient in row order (indexing's adds atomically)
        rows = [_PrefixLayer(layer.keys.index_select(0, row_prompt), layer.values.index_select(0, row_prompt))
                for layer in cache.layers]
        cache = DynamicCache(config=model.config)
        cache.layers = rows
    else:
        cache.batch_select_indices(row_prompt)
    return {name: cache}


def forward_takes(model: Any, argument: str) -> bool:
    """Whether the forward of ``model`` (of its base model, for a peft model) has a parameter ``argument``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return argument in _forward_parameters(type(base))


@cache
def _forward_parameters(cls: type) -> frozenset[str]:
    """The parameter names of ``cls.forward`` (read once per class: every forward of the learner asks)."""
    return frozenset(inspect.signature(cls.forward).parameters)


def cache_argument(model: Any) -> str:
    """``cache`` (recent transformers) or ``past_key_values`` (older): what the model's forward calls its cache."""
    return "cache" if forward_takes(model, "cache") else "past_key_values"
