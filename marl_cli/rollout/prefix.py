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

    None when the prompts cannot be cached apart (``cacheable``), when no two rows share a prompt unless
    ``always``, or when the model returned no cache: the caller then runs the plain forward.
    """
    width = prompt_ids.size(1)
    if not cacheable(model, width):
        return None
    distinct, row_prompt = _distinct(prompt_ids, prompt_mask)
    if len(distinct) == len(prompt_ids) and not always:
        return None
    prefix = model(input_ids=distinct[:, :width - 1], attention_mask=distinct[:, width:2 * width - 1],
                   use_cache=True, logits_to_keep=1)
    cache = prefix.get("cache", prefix.get("past_key_values"))
    if cache is None or cache.get_seq_length() != width - 1:
        return None
    cache.batch_select_indices(row_prompt)
    return {cache_argument(model): cache}


def cacheable(model: Any, width: int) -> bool:
    """Whether prompts ``width`` tokens wide can run ahead of what follows them: not a single token wide, and the
    model keeps a cache (its layers do not checkpoint activations in train mode)."""
    return width >= 2 and not (model.training and any(getattr(m, "gradient_checkpointing", False)
                                                      for m in model.modules()))


def shares_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> bool:
    """Whether two rows of the batch have the same (left-padded) prompt."""
    return len(_distinct(prompt_ids, prompt_mask)[0]) < len(prompt_ids)


def _distinct(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each distinct prompt as one row of its ids then its mask, and each row's index into them."""
    return torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)


def cache_argument(model: Any) -> str:
    """``cache`` (recent transformers) or ``past_key_values`` (older): what the model's forward calls its cache."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
