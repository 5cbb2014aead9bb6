"""Games: each role is a seat of the game (``workflow.roles`` in seat order), and the seat to move acts.

Every turn offers each seat its stage, in seat order; a seat acts only when the game says it is to move
(``acting``), so alternating games, games where a seat moves twice, and a seat moving again after an illegal move
(``env.illegal=retry``) all play in the same loop. A seat's prompt names its seat, the rules, its view of the game
and the legal moves (``{seat}``, ``{legal}`` beside the usual fields). Outcomes are known only when the game
ends: ``settle`` writes each seat's return (``OpenSpielEnv.returns``) as the reward of every row of that seat,
plus the retry penalty on a row whose move was illegal, and marks the row ``success`` when its seat won
(its return above every other seat's). Each row's ``info`` records ``win``, ``draw`` and ``loss`` for its seat,
``illegal`` for the row and ``truncated`` for a game cut off by ``workflow.max_turns``.

Who fills a seat is the policy regime's choice: one policy in every seat (``policy=shared``: self-play, each
seat told who it is), a policy per seat (``policy=per_role``), or a bot (``policy.scripted.player_1=mcts``:
``BOTS`` in ``envs/openspiel.py``), whose turns never train.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.envs.base import ENVS
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

OUTCOMES = ("win", "draw", "loss", "truncated")


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate observed over ``n`` games (95% for z = 1.96)."""
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


PROMPT = ("{rules}\nYou are {role} (seat {seat} of the game).\n{observation}\nLegal moves: {legal}\n"
          "Reply with one legal move after {marker}.\n")


@dataclass
class GameWorkflowConfig(WorkflowConfig):
    """Seats of a game (``workflow=game``)."""

    roles: list[str] = field(default_factory=lambda: ["player_0", "player_1"])  # the seats, in the game's order
    prompt: str = PROMPT  # fields as any workflow's, plus {seat} (its number) and {legal} (the legal moves)


def check_seats(cfg: Any) -> None:
    """The env is a game (it has ``seats``) and the workflow has a role for each of them; a bot in a seat can play
    the game."""
    game = ENVS.get(cfg.env.name)
    if not hasattr(game, "seats"):
        raise ConfigError(f"workflow=game plays games; env={cfg.env.name} is not one (env=openspiel, env=textarena, "
                          "env=pettingzoo)")
    roles, seats = list(cfg.workflow.roles), game.seats(cfg.env)
    if len(roles) != seats:
        what = cfg.env.get("game") or cfg.env.get("env_id")
        raise ConfigError(f"workflow.roles names {len(roles)} seats ({', '.join(roles)}) but {what} is played by "
                          f"{seats}: give one role per seat")
    for role, bot in (cfg.policy.get("scripted") or {}).items():
        if bot not in ("oracle", "empty"):
            game.check_bot(cfg.env, bot, f"policy.scripted.{role}")
    check_league(cfg)


def check_league(cfg: Any) -> None:
    """``eval.league`` (``training/league.py``) plays a two-seat game between at least two players, each a saved run
    or checkpoint or a bot the game can have."""
    entries = list(OmegaConf.select(cfg, "eval.league", default=None) or [])
    if not entries:
        return
    game = ENVS.get(cfg.env.name)
    if cfg.workflow.name != "game" or len(cfg.workflow.roles) != 2:
        raise ConfigError("eval.league plays a two-seat game (workflow=game with two roles)")
    if len(entries) < 2:
        raise ConfigError(f"eval.league needs two players or more, got {entries}")
    for entry in entries:
        if entry.startswith("bot:"):
            game.check_bot(cfg.env, entry.removeprefix("bot:"), "eval.league")
        elif not Path(entry).is_dir():
            raise ConfigError(f"eval.league names {entry}: no such run or checkpoint directory (or bot:<name>)")


@WORKFLOWS.register("game", schema=GameWorkflowConfig, check=check_seats)
class GameWorkflow(Workflow):
    """The seats of a game over a game env (``envs/games.py``: ``GameEnv``); the seat to move acts."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if not hasattr(env, "seats"):
            raise ConfigError(f"workflow=game plays games; env={env.cfg.name} is not one")
        if len(self.roles) != env.players:
            raise ConfigError(f"workflow.roles names {len(self.roles)} seats but the game is played by {env.players}")

    def acting(self, role: str, state: TeamState) -> bool:
        return not state.done and self.env.seat(state.env) == self.roles.index(role)

    def prompt(self, role: str, state: TeamState) -> str:
        seat = self.roles.index(role)
        legal = ", ".join(self.env.legal_moves(state.env)) or "as the game's messages say"
        return self.render(role, state, {"seat": str(seat), "observation": self.env.view(state.env, seat),
                                         "legal": legal, "rules": self.env.rules_for(state.env)})

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        new, penalty, format_ok, info = self.step_env(state, self.parse(text))
        return self.outcome(new, penalty, format_ok, info, team=0.0, solved=False)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """Each seat's return on each of its rows (+ the row's retry penalty), and its win, draw or loss."""
        returns = self.env.returns(state.env)
        truncated = float(not state.done)
        for row in rows:
            seat = self.roles.index(row.role)
            others = [r for p, r in enumerate(returns) if p != seat]
            mine = returns[seat]
            won, lost = all(mine > r for r in others), all(mine < r for r in others)
            row.reward = mine + row.info.get("local", 0.0)
            row.success = won
            row.info.update(win=float(won), loss=float(lost), draw=float(not won and not lost), truncated=truncated,
                            seat_return=mine)

    def outcome_metrics(self, finals: list[TeamState], prefix: str) -> dict[str, float]:
        """Per seat, over the games played: the share it won, drew and lost, the 95% Wilson interval of its win
        rate, the share it lost by its own illegal move and the share cut off (``<prefix>/<seat>/win`` ...); with a
        mixture of games, the same for each game too (``<prefix>/<game>/<seat>/win`` ...)."""
        metrics = self._outcomes(finals, prefix)
        by_game: dict[str, list[TeamState]] = {}
        for final in finals:
            by_game.setdefault(self.env.game_of(final.env), []).append(final)
        if len(by_game) > 1:
            for game, games in sorted(by_game.items()):
                metrics.update(self._outcomes(games, f"{prefix}/{game}"))
        return metrics

    def _outcomes(self, finals: list[TeamState], prefix: str) -> dict[str, float]:
        metrics: dict[str, float] = {}
        n = len(finals)
        if not n:
            return metrics
        counts = {role: dict.fromkeys((*OUTCOMES, "illegal_loss"), 0.0) for role in self.roles}
        for final in finals:
            returns = self.env.returns(final.env)
            for seat, role in enumerate(self.roles):
                others = [r for p, r in enumerate(returns) if p != seat]
                won, lost = all(returns[seat] > r for r in others), all(returns[seat] < r for r in others)
                tally = counts[role]
                tally["win"] += won
                tally["loss"] += lost
                tally["draw"] += not won and not lost
                tally["truncated"] += not final.done
                tally["illegal_loss"] += final.env.forfeit == seat
        for role, tally in counts.items():
            metrics.update({f"{prefix}/{role}/{k}": v / n for k, v in tally.items()})
            low, high = wilson(tally["win"] / n, n)
            metrics.update({f"{prefix}/{role}/win_low": low, f"{prefix}/{role}/win_high": high,
                            f"{prefix}/{role}/games": float(n)})
        metrics[f"{prefix}/games"] = float(n)
        return metrics

    def demonstration(self, role: str, state: TeamState) -> str | None:
        """A legal move for the seat to move (``OpenSpielEnv.oracle``), None for any other seat."""
        if not self.acting(role, state):
            return None
        move = self.env.oracle(state.env)
        return None if move is None else self.format_answer(move)
