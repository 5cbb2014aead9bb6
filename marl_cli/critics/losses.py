"""The value model's loss and diagnostics, as pure tensor functions over masked entries (tokens, rows, heads).

PPO's clipped value loss (Schulman et al. 2017; verl's ``compute_value_loss``), with ε the value clip:

    ℓ = ½·max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²)        (ℓ = ½·(V − R)² without a clip)

R the regression target (a GAE return, a TD target), V_old the value before the update.
"""

from __future__ import annotations

import torch


def value_terms(values: torch.Tensor, old_values: torch.Tensor | None, targets: torch.Tensor,
                clip: float | None) -> torch.Tensor:
    """ℓ of every entry (the module's formula), unreduced; ``old_values`` are only read with a ``clip``."""
    unclipped = (values - targets) ** 2
    if clip is None:
        return 0.5 * unclipped
    if old_values is None:
        raise ValueError("a clipped value loss needs the old values")
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(unclipped, (clipped - targets) ** 2)


def value_loss(values: torch.Tensor, old_values: torch.Tensor | None, targets: torch.Tensor, mask: torch.Tensor,
               clip: float | None) -> torch.Tensor:
    """Σ mask·ℓ / Σ mask: the mean of ℓ over the entries where ``mask`` is 1 (0 when there are none; masked-out
    entries, NaN included, add nothing to the loss or its gradient)."""
    real = mask.bool()
    old = None if old_values is None else old_values[real]
    return value_terms(values[real], old, targets[real], clip).sum() / real.sum().clamp(min=1)


def explained_variance(values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V)/Var(R) over the entries where ``mask`` is 1 (population variances): 1 for a perfect
    predictor, 0 for one no better than R's mean, negative for a worse one. 0.0 when Var(R) = 0 (constant targets:
    nothing to explain) or there are no entries."""
    real = mask.bool()
    r, v = targets[real].double(), values[real].double()
    if r.numel() == 0:
        return 0.0
    spread = float(r.var(correction=0))
    if spread == 0.0:
        return 0.0
    return 1.0 - float((r - v).var(correction=0)) / spread


def value_clip_fraction(values: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor, clip: float) -> float:
    """The share of the entries where ``mask`` is 1 whose value moved out of the clip range: |V − V_old| > ε (0.0
    without entries). verl counts the entries whose clipped term is the larger one, which needs the targets; this
    counts the moves the clip caps, whichever term wins."""
    real = mask.bool()
    moved = ((values - old_values).abs() > clip) & real
    return float(moved.sum()) / max(int(real.sum()), 1)
