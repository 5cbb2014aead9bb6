"""A round-robin league of game players and their Bradley–Terry ratings (``marl eval eval.league=[...]``).

Players are saved runs or checkpoints (``<run>`` or ``<run>/checkpoints/step_N``: the policy that plays the
run's first seat) and bots (``bot:random``, ``bot:mcts``, ...). Every ordered pair plays ``env.eval_size`` held-out
deals of a two-seat game, the first player in seat 0, so each pair meets in both seatings. A win scores 1, a draw
1/2 to each. The ratings are the Bradley–Terry maximum-likelihood strengths, P(i beats j) = p_i / (p_i + p_j),
fitted by Hunter's MM iteration (Ann. Statist. 2004):

    p_i ← W_i / Σ_{j≠i} n_ij / (p_i + p_j)

(W_i: i's points, n_ij: games between i and j) with one drawn game added between every pair, so a player that
won every game still has a finite strength; shown on the Elo scale, 400 · log10(p_i / geometric mean) + 1000.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from marl_cli.policies.scripted import policy_name
from marl_cli.training.build import Run, build_run

log = logging.getLogger(__name__)
ITERATIONS = 500


def bradley_terry(points: list[list[float]], iterations: int = ITERATIONS) -> list[float]:
    """Elo-scale Bradley–Terry ratings from ``points[i][j]`` (i's points against j), one draw added per pair."""
    n = len(points)
    won = [[points[i][j] + (0.5 if i != j else 0.0) for j in range(n)] for i in range(n)]
    games = [[won[i][j] + won[j][i] for j in range(n)] for i in range(n)]
    strength = [1.0] * n
    for _ in range(iterations):
        strength = [sum(won[i]) / sum(games[i][j] / (strength[i] + strength[j]) for j in range(n) if j != i)
                    for i in range(n)]
        mean = math.exp(sum(math.log(p) for p in strength) / n)
        strength = [p / mean for p in strength]
    return [1000.0 + 400.0 * math.log10(p) for p in strength]


def player_name(entry: str) -> str:
    """A league entry's short name: the bot's, or the run dir's name (with its checkpoint's step)."""
    if entry.startswith("bot:"):
        return entry.removeprefix("bot:")
    path = Path(entry)
    return f"{path.parents[1].name}@{path.name}" if path.parent.name == "checkpoints" else path.name


def players(cfg: DictConfig, run_dir: Path) -> tuple[Run, dict[str, str]]:
    """A run holding every player's policy under its own name (the first saved player's run; with bots only, the
    configured model's), and each player's routing target."""
    runs, policies, targets = [], {}, {}
    first = cfg.workflow.roles[0]
    for i, entry in enumerate(cfg.eval.league):
        name = player_name(entry)
        if entry.startswith("bot:"):
            targets[name] = policy_name(name)
            continue
        runs.append(build_run(OmegaConf.merge(cfg, {"load": entry, "eval": {"league": []}}), run_dir / f"player_{i}"))
        policies[f"league_{i}"] = runs[-1].policies[runs[-1].routing[first]]
        targets[name] = f"league_{i}"
    base = runs[0] if runs else build_run(OmegaConf.merge(cfg, {"load": None, "eval": {"league": []}}), run_dir)
    base.rollout.policies = policies
    return base, targets


def play_league(cfg: DictConfig, run_dir: Path, play: Any) -> dict[str, float]:
    """Every ordered pair's games (``play(run, routing)`` returns the final states) and the ratings:
    ``eval/league/<player>/rating`` and ``.../score`` (points per game)."""
    run, targets = players(cfg, run_dir)
    names, roles = list(targets), list(cfg.workflow.roles)
    points = [[0.0] * len(names) for _ in names]
    played = [0] * len(names)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i == j:
                continue
            finals = play(run, {roles[0]: targets[a], roles[1]: targets[b]})
            for final in finals:
                mine, theirs = run.workflow.env.returns(final.env)
                points[i][j] += 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
                points[j][i] += 1.0 if theirs > mine else 0.5 if mine == theirs else 0.0
            played[i] += len(finals)
            played[j] += len(finals)
    ratings = bradley_terry(points)
    for name, rating, total, n in zip(names, ratings, map(sum, points), played, strict=True):
        log.info("league: %s rating %.0f, %.3f points a game over %d games", name, rating, total / max(n, 1), n)
    metrics = {f"eval/league/{name}/rating": r for name, r in zip(names, ratings, strict=True)}
    metrics.update({f"eval/league/{name}/score": sum(points[k]) / max(played[k], 1) for k, name in enumerate(names)})
    return metrics
