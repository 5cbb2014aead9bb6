"""EPO's entropy terms (Xu et al. 2025, "EPO: Entropy-regularized Policy Optimization for LLM Agents
Reinforcement Learning", arXiv 2509.22576): a trajectory-level entropy bonus and a smoothing penalty that keeps each
token's entropy inside a corridor around the policy's historical mean entropy, weighted by a schedule over the run.

With H the per-token entropy, a trajectory j of T_j turns, turn t of |τ_jt| loss tokens, and B trajectories:

    L_H      = 1/B Σ_j 1/T_j Σ_t 1/|τ_jt| Σ_i H_jti                              (paper, eq. 2)
    P_jti    = [κ_l·H̄ − H_jti]_+ + [H_jti − κ_r·H̄]_+                              (eq. 3)
    L_smooth = 1/B Σ_j 1/T_j Σ_t 1/|τ_jt| Σ_i α·P_jti                            (eq. 4)
    β_k      = 1 + exp(−γ·k / k_mid),  k_mid = ⌊K/2⌋                              (eq. 5)
    L_EPO    = L_policy − λ·[L_H − β_k·L_smooth]                                  (eq. 6)

λ = ``loss.coef``, α = ``loss.penalty``, κ_l, κ_r = ``loss.corridor_low``, ``loss.corridor_high``, γ = ``loss.decay``
(``loss=epo``). H̄ is the mean of the earlier steps' token-mean entropies (the paper's cumulative window;
``loss.window`` keeps the last N), and L_smooth = 0 at the first step (no history). The penalty is differentiable in
H: it pushes a token's entropy back toward the corridor only while it is outside it. (The reference code builds the
penalty as a constant mask, which has no gradient; marl follows the paper's equation.) A trajectory is one role's
turns in one episode (``role_episodes``); within a mini-batch, the trajectories and turns are those the mini-batch
holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marl_cli.algorithms.grpo import role_episodes
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import LossConfig, bounded
from marl_cli.config.team import policy_loss, policy_trainer
from marl_cli.core.samples import Sample
from marl_cli.losses.base import LOSS_TERMS, LossKind

if TYPE_CHECKING:
    import torch

    from marl_cli.core.world import World


@dataclass
class EPOConfig(LossConfig):
    """EPO's entropy terms (``loss=epo``)."""

    coef: float = bounded(0.001, ge=0.0)  # EPO's λ (the reference scripts use 0.001); 0: off (for one policy)
    penalty: float = bounded(0.1, ge=0.0)  # EPO's α: the weight of the corridor penalty
    corridor_low: float = bounded(0.8, ge=0.0, le=1.0)  # EPO's κ_l (0: no lower bound)
    corridor_high: float = bounded(1.2, ge=1.0)  # EPO's κ_r
    decay: float = bounded(3.0, ge=0.0)  # EPO's γ: how fast β_k falls from 2 toward 1
    window: int = bounded(0, ge=0)  # EPO's reference: the mean entropy of the last N steps; 0: of every step


def corridor_penalty(entropies: torch.Tensor, reference: float, low: float, high: float) -> torch.Tensor:
    """P = [κ_l·H̄ − H]_+ + [H − κ_r·H̄]_+ per token: how far each entropy lies outside [``low``·H̄, ``high``·H̄]."""
    import torch

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
        cfg: the policy's ``loss`` settings (``EPOConfig``).
        steps: the run's RL steps (K in β_k).
    """

    entropies = True
    every_row = True

    def __init__(self, cfg: Any, steps: int):
        self.cfg = cfg
        self.steps = steps
        self.history: list[float] = []
        """The token-mean entropy of each earlier step's rows under the policy that sampled them."""

    def reference(self) -> float | None:
        """H̄: the mean of the history (its last ``window`` steps if set), or None before the first entry."""
        window = self.history[-self.cfg.window:] if self.cfg.window else self.history
        return sum(window) / len(window) if window else None

    def prepare(self, batch: dict[str, Any], rows: list[Sample], counted: list[bool], world: World,
                dtype: Any) -> None:
        """Each of this process's rows' weight in the trajectory mean (``trajectory_weights``), as ``epo_weights``."""
        import torch

        weights = world.share(trajectory_weights(rows, counted, world.size))
        batch["epo_weights"] = torch.tensor(weights, dtype=dtype, device=batch["completion_mask"].device)

    def __call__(self, batch: dict[str, Any], entropies: torch.Tensor, mask: torch.Tensor,
                 step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """−λ·[L_H − β_k·L_smooth] of a mini-batch (``mask``: the tokens the loss counts) at RL step ``step``, and
        its statistics."""
        cfg, weights = self.cfg, batch["epo_weights"]
        bonus = trajectory_mean(entropies, mask, weights)
        stats = {"epo/entropy": float(bonus.detach())}
        reference = self.reference()
        if reference is None:
            return -cfg.coef * bonus, stats
        penalty = corridor_penalty(entropies, reference, cfg.corridor_low, cfg.corridor_high)
        smooth = cfg.penalty * trajectory_mean(penalty, mask, weights)
        beta = smoothing_weight(step, self.steps, cfg.decay)
        outside = ((penalty > 0) & mask.bool()).sum() / mask.sum().clamp(min=1)
        stats.update({"epo/smooth": float(smooth.detach()), "epo/beta": beta, "epo/reference": reference,
                      "epo/outside_fraction": float(outside)})
        return -cfg.coef * (bonus - beta * smooth), stats

    def after_step(self, entropy_sum: float, tokens: float) -> None:
        """Append this step's token-mean entropy (every process's rows: the sums gathered) to the history."""
        if tokens:
            self.history.append(entropy_sum / tokens)

    def state_dict(self) -> dict[str, list[float]]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.history = list(state.get("history", []))


def check_epo(cfg: Any) -> None:
    """EPO's entropy bonus replaces TRL's (two would add up): no policy has both."""
    for name in ["", *cfg.policy.trainers]:
        trainer = policy_trainer(cfg, name) if name else cfg.trainer
        coef = policy_loss(cfg, name).coef if name else cfg.loss.coef
        where = f"policy.trainers.{name}" if name else "trainer"
        if coef != 0.0 and (trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy):
            raise ConfigError(f"loss=epo (coef={coef}) with TRL's entropy bonus ({where}.entropy_coef="
                              f"{trainer.entropy_coef}, use_adaptive_entropy={trainer.use_adaptive_entropy}): EPO's "
                              "trajectory-level bonus replaces it; keep one of the two")


LOSS_TERMS.register("epo", schema=EPOConfig, check=check_epo)(
    LossKind(lambda settings, trainer: EPO(settings, trainer.steps) if settings.coef != 0.0 else None))
