"""Prompt-prefix sharing: rows of a batch that share a prompt (a group's K samples, a tree's branches) run
that prompt through the model once, for generation and for the learner's scoring alike."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def shared_prompt_cache(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        always: bool = False) -> dict[str, Any] | None:
    """The key/value cache of every row's left-padded prompt but its last token, computed once per distinct
    prompt and copied to each row, as the keyword argument the model's forward (and ``generate``) takes it
    under; the caller feeds each row's last prompt token and what follows with it, at the full forward's
    positions and masks.

    None when no two rows share a prompt (unless ``always``: generation runs every prompt this way), a prompt
    is a single token wide, or the model keeps no cache (its layers checkpoint activations in train mode): the
    caller then runs the plain forward.
    """
    width = prompt_ids.size(1)
    if width < 2 or (model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())):
        return None
    distinct, row_prompt = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
    if len(distinct) == len(prompt_ids) and not always:
        return None
    prefix = model(input_ids=distinct[:, :width - 1], attention_mask=distinct[:, width:2 * width - 1],
                   use_cache=True, logits_to_keep=1)
    cache = prefix["cache"] if "cache" in prefix else prefix.get("past_key_values")
    if cache is None or cache.get_seq_length() != width - 1:
        return None
    cache.batch_select_indices(row_prompt)
    return {cache_argument(model): cache}


def cache_argument(model: Any) -> str:
    """``cache`` (recent transformers) or ``past_key_values`` (older): what the model's forward calls its cache."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
