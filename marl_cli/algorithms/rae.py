"""SPIRAL's role-conditioned advantage estimation (RAE; arXiv 2506.24119, code spiral-rl/spiral).

One shared policy plays every seat of a zero-sum game, and a seat's outcome depends on the seat (the first mover
wins more often), so the baseline is kept per game G and seat p: an exponential moving average of the seat's
game returns, read before it is updated with the game it scores (as SPIRAL's code does, from 0):

    A_{G,p} = R_p − b_{G,p},   then   b_{G,p} ← α · b_{G,p} + (1 − α) · R_p        (α = ``algorithm.alpha``, 0.95)

Every turn of seat p in the game gets A_{G,p} · γ^(n − 1 − i) on all its tokens (turn i of the seat's n turns;
``algorithm.gamma`` = 1 in SPIRAL: the same advantage on every turn), plus the row's own penalty where it was a
retried illegal move (``env.illegal=retry``; SPIRAL has no retries). No group mean and no standard deviation:
the baseline is the whole variance reduction. Games are taken in a fixed order (task, then branch), so a step's
baselines are a function of its rows. A turn whose advantage is exactly 0 is dropped from the update
(``algorithm.filter_zero``, SPIRAL's ``filter_zero_adv``). The baselines live in the loop's memory for this
algorithm and in every checkpoint, under ``"<game>/<seat>"``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import AlgorithmConfig, bounded
from marl_cli.core.samples import Sample


@dataclass
class RAEConfig(AlgorithmConfig):
    """SPIRAL's role-conditioned advantages: an EMA baseline per game and seat."""

    alpha: float = bounded(0.95, ge=0.0, le=1.0)  # the baseline's decay: b ← α·b + (1 − α)·R
    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # a seat's earlier turns get γ^(turns after them) of its advantage
    filter_zero: bool = True  # drop the turns whose advantage is exactly 0 (no gradient; SPIRAL's filter_zero_adv)


def check_game_rows(cfg: Any) -> None:
    """A game estimator reads each seat's game return, which ``workflow=game`` writes on its rows."""
    if cfg.workflow.name != "game":
        raise ConfigError(f"algorithm={cfg.algorithm.name} scores the seats of a game from their returns; "
                          f"workflow={cfg.workflow.name} is not a game (use workflow=game env=openspiel)")


def seat_games(samples: list[Sample]) -> dict[tuple[int, int, str], list[Sample]]:
    """Each seat's rows of each game, in turn order, by (task, branch, seat), games in (task, branch) order."""
    games: dict[tuple[int, int, str], list[Sample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: (s.task, s.branch, s.turn)):
        games[s.task, s.branch, s.role].append(s)
    return dict(sorted(games.items(), key=lambda item: (item[0][0], item[0][1])))


def game_of(rows: list[Sample]) -> str:
    """The game a seat's rows were played in (``info["game"]``, an index in a mixture; one game: 0)."""
    return str(int(rows[0].info.get("game", 0.0)))


def rae_estimator(samples: list[Sample], cfg: Any, rng: random.Random, rollouts: dict[int, list[int]] | None = None,
                  memory: dict[str, Any] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Every row's advantage from its seat's game return and the seat's running baseline (module docstring)."""
    baselines = memory if memory is not None else {}
    used: dict[str, list[float]] = defaultdict(list)
    for (_, _, seat), rows in seat_games(samples).items():
        key = f"{game_of(rows)}/{seat}"
        baseline = baselines.get(key, 0.0)
        outcome = rows[-1].info["seat_return"]  # the seat's game return (workflow=game writes it on every row)
        advantage = outcome - baseline
        baselines[key] = cfg.alpha * baseline + (1 - cfg.alpha) * outcome
        used[key].append(baseline)
        for i, s in enumerate(rows):  # + a retried illegal move's own penalty (env.illegal=retry)
            s.advantage = advantage * cfg.gamma ** (len(rows) - 1 - i) + s.reward - outcome
            s.keep = not (cfg.filter_zero and s.advantage == 0.0)
    stats = {f"rae/baseline/{key}": value for key, value in sorted(baselines.items())}
    stats["rae/kept"] = float(sum(s.keep for s in samples))
    return samples, stats


def rae_label(key: Any, single: bool) -> str:
    return "self-play + RAE (SPIRAL)"


ALGORITHMS.register("rae", schema=RAEConfig, check=check_game_rows)(
    Algorithm(rae_estimator, memory=True, label=rae_label))
