"""MARS's turn-level advantages with agent-specific normalisation (MARS/MARSHAL, arXiv 2510.15414; code
thu-nics/MARSHAL on ROLL), in the per-turn form marl's rows carry.

Each seat's turns in a game get a turn reward: the seat's game return on its last turn, plus
``algorithm.format_bonus`` on every legal move (MARSHAL: 0.05), plus a retried illegal move's own penalty. Then,
over the step's batch of games:

1. agent-specific centring: r̂ = r − mean(r) over the turns of the same game and seat (``agent_norm``; pooled
   over every turn otherwise);
2. whitening: r̃ = (r̂ − μ) / sqrt(σ² + 1e-8) over every turn (σ² unbiased);
3. turn-level returns: G_k = Σ_{j ≥ k} γ^(j − k) r̃_j over the seat's later turns in the game (γ = ``gamma``, 1);
4. agent-specific shift: A = G − mean(G) over the turns of the same game and seat (pooled without ``agent_norm``);
5. whitening: A ← (A − μ) / sqrt(σ² + 1e-8) over every turn (``whiten``).

ROLL computes these on token tensors: its per-turn rewards sit on each turn's last token, steps 2 and 5 average
over every response token (zeros included) and step 4 subtracts the mean of the tensor's distinct values. marl
computes them on turns (one reward, one advantage per turn), which keeps every statistic a function of the turns
and not of how many tokens each response happened to have; the order and the grouping are theirs.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.rae import check_game_rows, game_of, seat_games
from marl_cli.config.schema import AlgorithmConfig, bounded
from marl_cli.core.samples import Sample

EPS = 1e-8


@dataclass
class MARSConfig(AlgorithmConfig):
    """MARS's turn-level advantages, normalised per game and seat."""

    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # discount per later turn of the seat in the return-to-go
    format_bonus: float = 0.05  # added to the turn reward of every legal move (MARSHAL's format reward)
    agent_norm: bool = True  # centre rewards and shift advantages per game and seat (False: over every turn)
    whiten: bool = True  # whiten the advantages over the step's turns (step 5)


def _whiten(values: list[float]) -> list[float]:
    n = len(values)
    if n < 2:
        return [0.0] * n
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return [(v - mean) / (var + EPS) ** 0.5 for v in values]


def _centred(values: dict[int, float], groups: dict[str, list[int]]) -> dict[int, float]:
    out = {}
    for members in groups.values():
        mean = sum(values[i] for i in members) / len(members)
        out.update({i: values[i] - mean for i in members})
    return out


def turn_rewards(rows: list[Sample], format_bonus: float) -> list[float]:
    """A seat's turn rewards in one game: its return on the last turn, the format bonus on legal moves, the penalty of
    a retried illegal move."""
    outcome = rows[-1].info["seat_return"]
    return [(outcome if i == len(rows) - 1 else 0.0) + format_bonus * s.format_ok + (s.reward - outcome)
            for i, s in enumerate(rows)]


def mars_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                   rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Every row's turn-level advantage (module docstring)."""
    games = seat_games(samples)
    order = [s for rows in games.values() for s in rows]
    index = {id(s): i for i, s in enumerate(order)}
    groups: dict[str, list[int]] = defaultdict(list)
    rewards: dict[int, float] = {}
    for (_, _, seat), rows in games.items():
        for s, r in zip(rows, turn_rewards(rows, cfg.format_bonus), strict=True):
            rewards[index[id(s)]] = r
            groups[f"{game_of(rows)}/{seat}" if cfg.agent_norm else "all"].append(index[id(s)])
    centred = _centred(rewards, groups)
    white = dict(zip(sorted(centred), _whiten([centred[i] for i in sorted(centred)]), strict=True))
    returns: dict[int, float] = {}
    for rows in games.values():
        later = 0.0
        for s in reversed(rows):
            later = white[index[id(s)]] + cfg.gamma * later
            returns[index[id(s)]] = later
    advantages = _centred(returns, groups)
    final = [advantages[i] for i in range(len(order))]
    final = _whiten(final) if cfg.whiten else final
    for s, a in zip(order, final, strict=True):
        s.advantage = a
    n = max(len(order), 1)
    return samples, {"mars/turn_reward_mean": sum(rewards.values()) / n, "mars/return_mean": sum(returns.values()) / n}


def mars_label(key: Any, single: bool) -> str:
    return "self-play + MARS turn-level"


ALGORITHMS.register("mars", schema=MARSConfig, check=check_game_rows)(Algorithm(mars_estimator, label=mars_label))
