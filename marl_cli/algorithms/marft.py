"""MARFT's agent-sequential credit (Liao et al. 2025, "MARFT: Multi-Agent Reinforcement Fine-Tuning", arXiv
2504.16129) with an utterance-level critic (``critic=utterance``; ``critic.scope=team`` for MARFT's one critic of
the team): the agents of an episode act in a fixed order, each action one step of a Markov game, and GAE runs along
that order, agent after agent within a turn and on to the first agent of the next turn:

    δ_i = r_i + γ·V(s_{i+1}) − V(s_i),   A_i = δ_i + γλ·A_{i+1},   R_i = A_i + V(s_i)

i runs over an episode's rows by (turn, acting position); V(s_i) is the critic's value of the state row i acted
in (its prompt), 0 after the episode's last row. γ on every link, between two agents of one turn as between turns,
is MARFT's rule (``gae.py`` describes its code). A row's advantage is one number, on each of its tokens;
``algorithm.whiten`` normalises them over the step. Agent-by-agent training is ``trainer.alternate_every``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.gae import acting_order, sequence_gae, team_keys, whiten
from marl_cli.algorithms.ppo import GAEConfig
from marl_cli.algorithms.values import STATE_RETURNS
from marl_cli.config.schema import bounded
from marl_cli.core.samples import Sample


@dataclass
class MARFTConfig(GAEConfig):
    """GAE along an episode's acting order (marft): agent after agent within a turn, on to the next turn."""

    gamma: float = bounded(0.99, ge=0.0, le=1.0)  # the discount per link of the acting order (agent to agent)


def acting_positions(samples: list[Sample]) -> dict[str, int]:
    """Each role's place in a turn's acting order: the order the roles first act in the rows (the rollout records
    a turn's rows as its agents act)."""
    order: dict[str, int] = {}
    for s in sorted(samples, key=lambda s: s.turn):
        order.setdefault(s.role, len(order))
    return order


def utterance_values(samples: list[Sample], algorithm: str) -> list[float]:
    """Each row's critic value V(s) (``estimates["value"]``), or a ValueError naming a row without one."""
    for s in samples:
        if s.estimates.get("value") is None:
            raise ValueError(f"row (task {s.task}, turn {s.turn}, role {s.role}) has no critic value: "
                             f"algorithm={algorithm} reads critic=utterance")
    return [s.estimates["value"] for s in samples]


def marft_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                    rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """GAE along each episode's acting order: every row gets ``advantage`` and ``estimates["returns"]`` (one
    target)."""
    import torch

    values = torch.tensor(utterance_values(samples, "marft"), dtype=torch.float64)
    if not samples:
        return samples, {}
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    chain = acting_order(team_keys(samples), acting_positions(samples))
    advantages, returns = sequence_gae(rewards, values, chain, cfg.gamma, cfg.lam)
    if cfg.whiten and len(samples) >= 2:
        advantages = whiten(advantages, torch.ones_like(advantages))
    for s, a, r in zip(samples, advantages.tolist(), returns.tolist(), strict=True):
        s.advantage, s.estimates["returns"] = a, [r]
    return samples, {"value_mean": float(values.mean()), "return_mean": float(returns.mean())}


ALGORITHMS.register("marft", schema=MARFTConfig)(Algorithm(marft_estimator, values=STATE_RETURNS))
