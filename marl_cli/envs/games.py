"""What the game envs share (``env=openspiel``, ``env=textarena``, ``env=pettingzoo``): ``GameEnv``, an env whose
seats are the roles of ``workflow=game`` (``workflows/game.py``).

A game state carries ``over``, ``forfeit`` (the seat that lost by an illegal move) and ``illegal`` (each seat's
illegal moves so far). ``GameEnv`` owns what follows from that alone: the observation is the view of the seat to
move; no seat moves once the game is over; the illegal-move rule (``env.illegal``: ``lose`` ends the game, the
offender scoring ``env.illegal_reward`` and every other seat ``env.illegal_others``; ``retry`` leaves the state as
it was for the same seat to move again, ``env.retry_penalty`` on that row, until ``env.max_retries`` illegal moves
of one seat, then ``lose``); each seat's return (the rule's after a forfeit, the game's own at its end, 0 for every
seat in a game cut off before it: a draw); the score (1 for a game played out by its rules); the bots any game with
a move list has (``random``, ``first_legal``) and the oracle (a random legal move, for warm starts); the refusal of a
bot the game lacks; and the defaults of ``rules_for`` and ``game_of`` for an env of one game.
"""

from __future__ import annotations

import random
import re
from abc import abstractmethod
from dataclasses import replace
from typing import Any, ClassVar

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import choices
from marl_cli.envs.base import Env, Transition

IllegalRule = choices("IllegalRule", "lose", "retry", module=__name__)
SIMPLE_BOTS = ("random", "first_legal")
"""The bots ``GameEnv.bot_move`` plays from the legal moves alone."""


def require_game_workflow(cfg: Any, env: str) -> None:
    """``env`` (a game) is played by ``workflow=game``: a one-line ConfigError otherwise."""
    if cfg.workflow.name != "game":
        raise ConfigError(f"env={env} is a game: play it with workflow=game (one role per seat), not "
                          f"workflow={cfg.workflow.name}")


def normalise(text: str) -> str:
    """A move's name as matched: lower case, no spaces, brackets, quotes or final full stop."""
    return re.sub(r"[\s\[\]()'\"`*]", "", text.lower()).rstrip(".")


class GameEnv(Env):
    """A game of ``players`` seats; a subclass says who is to move, what is legal, what a seat sees, how a legal
    move is played (``move``) and what the game pays at its end (``outcome``)."""

    library: ClassVar[str] = ""
    """The library the games come from, as messages name it."""
    bots: ClassVar[tuple[str, ...]] = ()
    """The bots a seat can be given (``policy.scripted.<seat>``, ``env.eval_opponents``)."""
    game_key: ClassVar[str] = "env_id"
    """The config field that names the game (``game_of``)."""
    players: int

    @staticmethod
    @abstractmethod
    def seats(cfg: Any) -> int:
        """The seats of the game ``cfg`` (the env's config) names."""

    @classmethod
    def check_bot(cls, cfg: Any, bot: str, where: str) -> None:
        """``bot`` (named at ``where``) can fill a seat: a one-line ConfigError otherwise."""
        if not cls.bots:
            raise ConfigError(f"{where}={bot}: {cls.library} games have no bots in marl (OpenSpiel's do); fill the "
                              "seat with a policy (policy=per_role, trainer.frozen_roles for a fixed one)")
        if bot not in cls.bots:
            raise ConfigError(f"{where}={bot}: no such bot; choose from: {', '.join(cls.bots)}")

    @abstractmethod
    def seat(self, state: Any) -> int | None:
        """The seat to move, or None when the game is over."""

    @abstractmethod
    def legal_moves(self, state: Any) -> list[str]:
        """The legal moves of the seat to move by name (none when the game is over, or names none)."""

    @abstractmethod
    def view(self, state: Any, seat: int) -> str:
        """What ``seat`` sees of ``state``."""

    @abstractmethod
    def move(self, state: Any, action: str | None) -> Transition:
        """Play the seat to move's ``action`` in a game not yet over (an illegal one by ``refuse``)."""

    @abstractmethod
    def outcome(self, state: Any) -> list[float]:
        """Each seat's return by the game's own rules, in a game over without a forfeit."""

    def rules_for(self, state: Any) -> str:
        """The rules of the game ``state`` is a position of."""
        return self.rules()

    def game_of(self, state: Any) -> str:
        """The name of the game ``state`` is a position of."""
        return str(getattr(self.cfg, self.game_key))

    def observe(self, state: Any) -> str:
        seat = self.seat(state)
        return self.view(state, 0 if seat is None else seat)

    def step(self, state: Any, action: str | None) -> Transition:
        """Play the seat to move's ``action``; an illegal or missing one by ``env.illegal``."""
        if state.over:
            raise ValueError("the game is over: no seat is to move")
        return self.move(state, action)

    def refuse(self, state: Any, seat: int, info: dict[str, float] | None = None) -> Transition:
        """``seat``'s illegal move by ``env.illegal``: moved again (``retry``, up to ``env.max_retries``) or the game
        lost (``lose``); ``info`` adds to the row's."""
        illegal = tuple(n + (p == seat) for p, n in enumerate(state.illegal))
        info = {"illegal": 1.0, **(info or {})}
        if self.cfg.illegal == "retry" and illegal[seat] <= self.cfg.max_retries:
            return Transition(replace(state, illegal=illegal), self.cfg.retry_penalty, False, False, False, info)
        return Transition(replace(state, illegal=illegal, forfeit=seat), 0.0, True, False, False, info)

    def returns(self, state: Any) -> list[float]:
        """Each seat's outcome: the illegal-move rule's after a forfeit, the game's own at its end, 0 for every seat
        in a game cut off before its end."""
        if state.forfeit is not None:
            return [self.cfg.illegal_reward if p == state.forfeit else self.cfg.illegal_others
                    for p in range(self.players)]
        if state.over:
            return self.outcome(state)
        return [0.0] * self.players

    def score(self, state: Any) -> float:
        """1 once the game has ended by its rules (no forfeit), else 0: whether it was played out."""
        return float(state.over and state.forfeit is None)

    def oracle(self, state: Any) -> str | None:
        """A legal move drawn uniformly from the position's own generator: what a warm start on legal moves shows
        (a game has no single right move; the demonstrations teach the answer format and the legal moves); None
        for a game without bots (no move list)."""
        return self.bot_move(state, "random") if self.bots else None

    def bot_move(self, state: Any, bot: str) -> str | None:
        """The move ``bot`` (``SIMPLE_BOTS``) plays in ``state``, by name; None when the game is over. ``random``
        draws from a generator of the position (the state's deal ``seed``, its ``moves`` and illegal moves)."""
        if state.over:
            return None
        legal = self.legal_moves(state)
        if bot == "first_legal":
            return legal[0]
        if bot == "random":
            key = f"{state.seed}/{state.moves}/{sum(state.illegal)}"  # the same position, the same draw
            return random.Random(f"marl-bot/{bot}/{key}").choice(legal)
        raise ValueError(f"unknown bot {bot!r}; choose from: {', '.join(SIMPLE_BOTS)}")
