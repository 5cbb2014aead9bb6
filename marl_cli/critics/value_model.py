"""The value model: a causal LM's decoder without its LM head, and a linear head giving ``heads`` values at every
position; built from a copy of a policy's model or fresh from a model config.

The trunk's output is the last layer's hidden state after the final norm, h_t ∈ ℝ^d, and V(x_{≤t}) = W·h_t + b,
W ∈ ℝ^{heads×d}. The head starts at W ~ N(0, (0.1/√d)²), b = 0: for a unit-RMS h_t (the final RMSNorm's output
with its weights at 1) W·h_t ~ N(0, 0.01) whatever the width, so the values start near 0, small next to rewards
of order 1 (no head dominates the first targets), yet W ≠ 0 so the trunk gets a gradient from the first step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from marl_cli.policies.loading import load_model, resolve_source
from marl_cli.rollout.prefix import keeping_cache, shared_prompt_cache

HEAD_SCALE = 0.1
"""The head's initial weights have std ``HEAD_SCALE``/√d (see the module's docstring)."""


class ValueModel(torch.nn.Module):
    """``heads`` values at every position of a token row: ``head(trunk(x))``.

    Args:
        trunk: a decoder returning ``last_hidden_state`` (e.g. ``Qwen3ForCausalLM.model``, ``get_decoder()``).
        heads: how many values each position gets (1 for PPO's V; ArCHer's double critic: 4).
        seed: the head's initial weights are drawn from a generator seeded with it (the global RNG is untouched).
        pad_id: the id padding positions carry (any id the trunk embeds: they are masked out).
    """

    def __init__(self, trunk: torch.nn.Module, heads: int, seed: int, pad_id: int = 0):
        super().__init__()
        if heads < 1:
            raise ValueError(f"a value model needs at least one head, got {heads}")
        self.trunk = trunk
        self.pad_id = pad_id
        hidden = trunk.config.hidden_size
        parameter = next(trunk.parameters())
        # built without torch's default init (it draws from the global generator), then drawn from ``seed``
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, hidden, heads, dtype=parameter.dtype)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            torch.nn.init.normal_(self.head.weight, std=HEAD_SCALE / hidden ** 0.5, generator=generator)
            self.head.bias.zero_()
        self.head.to(parameter.device)

    @property
    def heads(self) -> int:
        return self.head.out_features

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int = 0) -> torch.Tensor:
        """(B, L, heads) values of (B, L) rows. Positions count the real tokens only (cumsum(mask) − 1), so a row
        gets the same values left-padded or not; values at padding positions are meaningless.

        ``prompt_width`` W > 0 (the rows' first W columns are their left-padded prompts): the values of columns
        W − 1 onwards only, (B, L − W + 1, heads), each distinct prompt but its last token running through the trunk
        once for the rows that share it (``shared_prompt_cache``; a group's K rows, as the policy's scoring does):
        the same values up to float rounding, gradients flowing back through the shared pass."""
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        tail = max(prompt_width - 1, 0)
        cache = None
        if prompt_width >= 2:
            with keeping_cache(self.trunk):
                cache = shared_prompt_cache(self.trunk, input_ids[:, :prompt_width], attention_mask[:, :prompt_width],
                                            replayable=True, mask_positions=True)
        if cache is None:
            hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                use_cache=False).last_hidden_state
            return self.head(hidden.to(self.head.weight.dtype))[:, tail:]  # the head on whole rows: same rounding
        with keeping_cache(self.trunk):
            hidden = self.trunk(input_ids=input_ids[:, tail:], attention_mask=attention_mask,
                                position_ids=positions[:, tail:], **cache).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype))


def build_value_model(source_model: PreTrainedModel | None, model_cfg: Any | None, heads: int, seed: int,
                      workdir: Path, device: torch.device, suffix: str = "_critic") -> ValueModel:
    """A value model with fp32 weights on ``device``: the trunk of a deep copy of ``source_model`` (a policy's full
    causal LM: the critic starts from the policy's weights as they are now, as verl's critic starts from the
    actor's), else of a fresh model from ``model_cfg`` (``name_or_path``, or ``tiny``: saved once under
    ``workdir/tiny_init<suffix>``, its weights drawn from ``seed``, as ``resolve_source`` does; ``dtype`` is not
    read: the weights train in fp32). The model must read the policy's token ids (the same tokenizer). A peft model
    (an adapter policy) is a ValueError: give its model config instead."""
    if source_model is None and model_cfg is None:
        raise ValueError("build_value_model needs a source model or a model config")
    if source_model is not None:
        if hasattr(source_model, "peft_config"):
            raise ValueError("build_value_model copies full models; for an adapter policy give the model config")
        config, trunk = source_model.config, copy.deepcopy(source_model.get_decoder())
    else:
        model = load_model(resolve_source(model_cfg, seed, workdir, suffix), "float32", device)
        config, trunk = model.config, model.get_decoder()
    trunk = trunk.to(device=device, dtype=torch.float32).requires_grad_(True)
    pad_id = config.pad_token_id
    return ValueModel(trunk, heads, seed, 0 if pad_id is None else int(pad_id))
