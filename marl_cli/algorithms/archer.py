"""ArCHer's high-level credit (Zhou et al. 2024, "ArCHer: Training Language Model Agents via Hierarchical
Multi-Turn RL", arXiv 2402.19446): an off-policy utterance-level critic (``critic=utterance``: two Q heads and two
V heads, target copies, a replay buffer; trained by the loop, ``training.critic_phase``) gives each turn the
advantage of its utterance in the state it was said in,

    A = min(Q1, Q2)(s, a) − min(V1, V2)(s)

and the token-level policy is trained with it, the same value on each of the turn's tokens, through TRL's clipped
loss. The critic's targets are TD targets across a role's turns, Q_i(s, a) ← r + γ·V̄_i(s′) and V_i(s) ← Q̄_i(s, a)
(``algorithms/td.py``).
"""

from __future__ import annotations

import random
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.marft import utterance_values
from marl_cli.rollout.samples import Sample


def archer_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                     rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Each row's ``advantage`` = its critic Q minus its critic V (both the minimum of the two heads)."""
    values = utterance_values(samples, "archer")
    for s, v in zip(samples, values, strict=True):
        if s.q_value is None:
            raise ValueError(f"row (task {s.task}, turn {s.turn}, role {s.role}) has no critic Q value: "
                             "algorithm=archer reads critic=utterance")
        s.advantage = s.q_value - v
    n = max(len(samples), 1)
    return samples, {"value_mean": sum(values) / n, "q_mean": sum(s.q_value for s in samples) / n}


ALGORITHMS.register("archer")(Algorithm(archer_estimator, critic="utterance"))
