"""The losses that train learned reward models, and SPA's step rewards: pure functions on tensors.

**Bradley–Terry** (a scalar reward model r(x) from preference pairs, x⁺ preferred to x⁻)::

    L_BT = −mean log σ(r(x⁺) − r(x⁻))          ∂L/∂r(x⁺) = −σ(r(x⁻) − r(x⁺)) / N = −∂L/∂r(x⁻)

**Regression** (a scalar reward model from labels y, e.g. the program's verdict)::

    L_reg = mean (r(x) − y)²

**SPA's progress estimator** (Wang et al., "Stepwise Progress Attribution", arXiv 2505.20732; code
WangHanLinHenry/SPA-RL-Agent, ``prm/train_our_progress_model.py``): each step t of an episode gets a contribution
c_t, and the contributions of an episode must add up to its outcome R::

    L_SPA = mean over episodes (Σ_t c_t − R)²

and the step reward the policy trains on is (``progress_rewards``)::

    r_t = α·c_t + β·g_t          g_t = 1 if step t's action was valid (executable, parsable), else 0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the functions' first call, not with the plug-ins (config checks stay light)
    import torch


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """−mean log σ(r⁺ − r⁻) over the pairs (``chosen[i]`` preferred to ``rejected[i]``)."""
    import torch.nn.functional as F

    if chosen.shape != rejected.shape or chosen.numel() == 0:
        raise ValueError(f"Bradley–Terry needs as many chosen as rejected scores, at least one: {tuple(chosen.shape)} "
                         f"vs {tuple(rejected.shape)}")
    return -F.logsigmoid(chosen - rejected).mean()


def regression_loss(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean (r − y)²."""
    import torch.nn.functional as F

    return F.mse_loss(scores, targets.to(scores.dtype))


def progress_loss(contributions: Sequence[torch.Tensor], outcomes: torch.Tensor) -> torch.Tensor:
    """mean over episodes of (Σ_t c_t − R)²; ``contributions[e]`` holds episode e's c_t, ``outcomes[e]`` its R."""
    import torch
    import torch.nn.functional as F

    if len(contributions) != outcomes.numel() or not contributions:
        raise ValueError(f"{len(contributions)} episodes of contributions for {outcomes.numel()} outcomes")
    sums = torch.stack([c.sum() for c in contributions])
    return F.mse_loss(sums, outcomes.to(sums.dtype))


def progress_rewards(contributions: Sequence[float], valid: Sequence[bool], alpha: float, beta: float) -> list[float]:
    """r_t = α·c_t + β·g_t of each step."""
    return [alpha * c + beta * float(g) for c, g in zip(contributions, valid, strict=True)]
