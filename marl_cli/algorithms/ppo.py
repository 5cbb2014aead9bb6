"""PPO with GAE at the token level (Schulman et al. 2017; GAE: Schulman et al. 2016), the baseline of the
value-based algorithms: a learned critic scores V(s_t) before every completion token (``critic=token``), and each
of a role's trajectories (its turns in one episode, ``role_episodes``) is one token sequence:

    r_t = the turn's reward on its last token, 0 on the others
    δ_t = r_t + γ·V(s_{t+1}) − V(s_t),   A_t = Σ_l (γλ)^l δ_{t+l},   R_t = A_t + V(s_t)

V(s_{t+1}) after a turn's last token is V before the first token of the role's next turn, and 0 after its last
turn (the episode ended, or hit its turn limit: the limit is part of the task). ``algorithm.whiten`` normalises the
token advantages over the step's tokens (mean 0, std 1); the critic regresses R_t. The update is TRL's clipped loss
on the per-token advantages, as every algorithm's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.gae import gae, whiten
from marl_cli.algorithms.grpo import role_episodes
from marl_cli.algorithms.values import TOKEN_RETURNS
from marl_cli.config.schema import AlgorithmConfig, bounded
from marl_cli.core.samples import Sample


@dataclass
class GAEConfig(AlgorithmConfig):
    """GAE over a role's completion tokens (ppo): ``gamma`` discounts each token, ``lam`` trades the critic's bias
    (0: one-step TD) for the returns' variance (1: Monte-Carlo returns minus the value)."""

    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # the discount per completion token (a turn's reward on its last)
    lam: float = bounded(0.95, ge=0.0, le=1.0)  # GAE's λ
    whiten: bool = True  # advantages normalised over the step's rows (mean 0, std 1), as PPO does


def ppo_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                  rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Token-level GAE over each role's trajectory: every row gets ``token_advantages`` and ``returns`` (one per
    completion token) and ``advantage`` their mean."""
    import torch

    for s in samples:
        if len(s.estimates.get("values", ())) != len(s.completion_ids):
            raise ValueError(f"row (task {s.task}, turn {s.turn}, role {s.role}) has "
                             f"{len(s.estimates.get('values', ()))} critic values "
                             f"for {len(s.completion_ids)} completion tokens: algorithm=ppo reads critic=token")
    trajectories = role_episodes(samples)
    width = max((sum(len(samples[i].completion_ids) for i in idx) for idx in trajectories), default=0)
    rewards = torch.zeros(len(trajectories), width, dtype=torch.float64)
    values, mask = torch.zeros_like(rewards), torch.zeros_like(rewards)
    spans: dict[int, tuple[int, int, int]] = {}
    for b, idx in enumerate(trajectories):
        start = 0
        for i in idx:
            n = len(samples[i].completion_ids)
            spans[i] = (b, start, n)
            values[b, start:start + n] = torch.tensor(samples[i].estimates["values"], dtype=torch.float64)
            mask[b, start:start + n] = 1.0
            if n:
                rewards[b, start + n - 1] = samples[i].reward
            start += n
    advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten and mask.sum() >= 2:
        advantages = whiten(advantages, mask)
    for i, (b, start, n) in spans.items():
        s = samples[i]
        s.token_advantages = advantages[b, start:start + n].tolist()
        s.estimates["returns"] = returns[b, start:start + n].tolist()
        s.advantage = sum(s.token_advantages) / n if n else 0.0
    return samples, _stats(samples, mask, values, returns)


def _stats(samples: list[Sample], mask: Any, values: Any, returns: Any) -> dict[str, float]:
    """The value and return means over the step's tokens, and the rows without a token (their reward reaches no
    token: counted)."""
    tokens = max(float(mask.sum()), 1.0)
    return {"value_mean": float((values * mask).sum()) / tokens, "return_mean": float((returns * mask).sum()) / tokens,
            "empty_rows": float(sum(not s.completion_ids for s in samples))}


ALGORITHMS.register("ppo", schema=GAEConfig)(Algorithm(ppo_estimator, values=TOKEN_RETURNS))
