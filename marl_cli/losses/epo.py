"""EPO's entropy terms (Xu et al. 2025, "EPO: Entropy-regularized Policy Optimization for LLM Agents
Reinforcement Learning", arXiv 2509.22576): a trajectory-level entropy bonus and a smoothing penalty that keeps each
token's entropy inside a corridor around the policy's historical mean entropy, weighted by a schedule over the run.

With H the per-token entropy, a trajectory j of T_j turns, turn t of |τ_jt| loss tokens, and B trajectories:

    L_H      = 1/B Σ_j 1/T_j Σ_t 1/|τ_jt| Σ_i H_jti                              (paper, eq. 2)
    P_jti    = [κ_l·H̄ − H_jti]_+ + [H_jti − κ_r·H̄]_+                              (eq. 3)
    L_smooth = 1/B Σ_j 1/T_j Σ_t 1/|τ_jt| Σ_i α·P_jti                            (eq. 4)
    β_k      = 1 + exp(−γ·k / k_mid),  k_mid = ⌊K/2⌋                              (eq. 5)
    L_EPO    = L_policy − λ·[L_H − β_k·L_smooth]                                  (eq. 6)

H̄ is the mean of the earlier steps' token-mean entropies (the paper's cumulative window; ``trainer.epo_window``
keeps the last N), and L_smooth = 0 at the first step (no history). The penalty is differentiable in H: it pushes a
token's entropy back toward the corridor only while it is outside it. (The reference code builds the penalty as a
constant mask, which has no gradient; marl follows the paper's equation.) A trajectory is one role's turns in one
episode (``role_episodes``); within a mini-batch, the trajectories and turns are those the mini-batch holds.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from marl_cli.algorithms.grpo import role_episodes
from marl_cli.core.samples import Sample


def corridor_penalty(entropies: torch.Tensor, reference: float, low: float, high: float) -> torch.Tensor:
    """P = [κ_l·H̄ − H]_+ + [H − κ_r·H̄]_+ per token: how far each entropy lies outside [``low``·H̄, ``high``·H̄]."""
    return torch.relu(low * reference - entropies) + torch.relu(entropies - high * reference)


def smoothing_weight(step: int, total: int, decay: float) -> float:
    """β_k = 1 + exp(−γ·k / k_mid) with k_mid = ⌊K/2⌋ (at least 1): 2 at the first step, 1 + e^(−γ) at mid-run."""
    return 1.0 + math.exp(-decay * step / max(total // 2, 1))


def trajectory_weights(rows: list[Sample], counted: list[bool], processes: int = 1) -> list[float]:
    """Each row's weight in EPO's trajectory mean, 1 / (B·T_j), over the rows whose tokens the loss counts
    (``counted``): B trajectories among them, T_j of them in the row's own; 0 for the others. Times ``processes``:
    each process sums its own rows' terms and the gradients are averaged over the processes."""
    weights = [0.0] * len(rows)
    episodes = [[i for i in idx if counted[i]] for idx in role_episodes(rows)]
    episodes = [idx for idx in episodes if idx]
    for idx in episodes:
        for i in idx:
            weights[i] = processes / (len(episodes) * len(idx))
    return weights


def trajectory_mean(values: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_r w_r · (token mean of ``values`` over row r's ``mask``): with ``trajectory_weights``, the mean over
    trajectories of the mean over turns of each turn's token mean (a row without tokens adds 0)."""
    per_row = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return (per_row * weights.to(per_row.dtype)).sum()


class EPO:
    """EPO's term of one policy's loss, and the entropy history it is anchored to.

    Args:
        trainer_cfg: the policy's ``trainer`` config: ``epo_coef`` (λ), ``epo_penalty`` (α), ``epo_corridor_low``
            and ``epo_corridor_high`` (κ_l, κ_r), ``epo_decay`` (γ), ``epo_window`` (0: every earlier step) and
            ``steps`` (K).
    """

    def __init__(self, trainer_cfg: Any):
        self.cfg = trainer_cfg
        self.history: list[float] = []
        """The token-mean entropy of each earlier step's rows under the policy that sampled them."""

    def reference(self) -> float | None:
        """H̄: the mean of the history (its last ``epo_window`` steps if set), or None before the first entry."""
        window = self.history[-self.cfg.epo_window:] if self.cfg.epo_window else self.history
        return sum(window) / len(window) if window else None

    def loss(self, entropies: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
             step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """−λ·[L_H − β_k·L_smooth] of a mini-batch (``mask``: the tokens the loss counts; ``weights``:
        ``trajectory_weights``) at RL step ``step``, and its statistics."""
        cfg = self.cfg
        bonus = trajectory_mean(entropies, mask, weights)
        stats = {"epo/entropy": float(bonus.detach())}
        reference = self.reference()
        if reference is None:
            return -cfg.epo_coef * bonus, stats
        penalty = corridor_penalty(entropies, reference, cfg.epo_corridor_low, cfg.epo_corridor_high)
        smooth = cfg.epo_penalty * trajectory_mean(penalty, mask, weights)
        beta = smoothing_weight(step, cfg.steps, cfg.epo_decay)
        outside = ((penalty > 0) & mask.bool()).sum() / mask.sum().clamp(min=1)
        stats.update({"epo/smooth": float(smooth.detach()), "epo/beta": beta, "epo/reference": reference,
                      "epo/outside_fraction": float(outside)})
        return -cfg.epo_coef * (bonus - beta * smooth), stats

    def record(self, entropy_sum: float, tokens: float) -> None:
        """Append this step's token-mean entropy (every process's rows: the sums gathered) to the history."""
        if tokens:
            self.history.append(entropy_sum / tokens)

    def state_dict(self) -> dict[str, list[float]]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.history = list(state.get("history", []))
