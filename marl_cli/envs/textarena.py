"""Games from TextArena as environments: any registered TextArena env id (``env=textarena
env.env_id=SimpleNegotiation-v0-raw``), text in and text out, the rules and rewards the library has.

A task is the library's seed for ``reset`` (TextArena deals resources, cards or roles from it); the library reseeds
Python's global generator there, so marl restores it around every call into the library. A state is a copy of the
library's env (``step`` copies it, so a position can be played many ways) and each seat's log of what it was told:
every message the library addressed to the seat (``[GAME]`` for the game master's, ``[Player k]`` for a player's
move), so a seat's view is its whole game as the library showed it. An answer (the text after the answer marker) is
passed to the library as the move; the library parses it. A move the library refuses is illegal: with
``env.illegal=lose`` TextArena's error allowance is 0 and the offender loses at once (``env.illegal_reward`` for
it, ``env.illegal_others`` for every other seat: SPIRAL's −1.5/+0.5); with ``retry`` the allowance is
``env.max_retries`` and the seat moves again after each refused move (``env.retry_penalty`` on that row). No answer
marker at all is refused by marl itself, by the same rule. A game cut off by ``workflow.max_turns`` is a draw.

TextArena is an optional dependency (``pip install 'marl[games]'``), imported only when a game is built.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded
from marl_cli.envs.base import ENVS, Transition, own_random
from marl_cli.envs.games import GameEnv, IllegalRule, require_game_workflow
from marl_cli.envs.openspiel import INSTALL


@dataclass
class TextArenaConfig(EnvConfig):
    """A TextArena game (``textarena.envs.registration.ENV_REGISTRY``)."""

    name: str = "textarena"
    env_id: str = "SimpleNegotiation-v0-raw"  # a registered id (the -raw variants: no observation wrappers)
    players: int = bounded(2, ge=1)  # seats (the game's own range applies)
    illegal: IllegalRule = IllegalRule.lose  # a move the game refuses: the offender loses, or moves again
    illegal_reward: float = -1.5  # illegal=lose: the offender's return (SPIRAL's training rule)
    illegal_others: float = 0.5  # illegal=lose: every other seat's return
    retry_penalty: float = bounded(-0.1, le=0.0)  # illegal=retry: added to the reward of the refused move's row
    max_retries: int = bounded(3, ge=0)  # illegal=retry: refused moves in a row before the offender loses


def make_game(cfg: Any) -> Any:
    """A fresh env of ``cfg.env_id``; a one-line ConfigError for an unknown id or TextArena not installed."""
    try:
        import textarena
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError:
        raise ConfigError(f"env=textarena needs TextArena: {INSTALL}") from None
    if cfg.env_id not in ENV_REGISTRY:
        near = difflib.get_close_matches(cfg.env_id, list(ENV_REGISTRY), n=4, cutoff=0.6)
        raise ConfigError(f"env.env_id={cfg.env_id}: no such TextArena env" + (f"; similar: {', '.join(near)}" if near
                                                                               else ""))
    with own_random():
        return textarena.make(cfg.env_id)


def check_arena(cfg: Any) -> None:
    """The env id exists, the game takes ``env.players`` seats, and a game workflow plays it."""
    require_game_workflow(cfg, "textarena")
    TextArenaEnv.reset_game(cfg.env, 0)


@dataclass(frozen=True)
class ArenaState:
    """A TextArena game in progress: the library's env, each seat's log, who forfeited and each seat's refusals."""

    game: Any
    logs: tuple[tuple[str, ...], ...]
    forfeit: int | None = None
    illegal: tuple[int, ...] = ()

    @property
    def over(self) -> bool:
        return bool(self.game.state.done)


@ENVS.register("textarena", schema=TextArenaConfig, check=check_arena)
class TextArenaEnv(GameEnv):
    """A TextArena game; a task is its seed, seats are ``workflow=game``'s roles."""

    library = "TextArena"

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.players = cfg.players
        self.reset_game(cfg, 0)

    @staticmethod
    def seats(cfg: Any) -> int:
        return cfg.players

    @staticmethod
    def reset_game(cfg: Any, seed: int) -> Any:
        """The library's env of ``cfg.env_id`` reset for ``cfg.players`` seats from ``seed``, with the error allowance
        of ``env.illegal``; a one-line ConfigError where the game refuses the seat count."""
        game = make_game(cfg)
        try:
            with own_random():
                game.reset(num_players=cfg.players, seed=seed)
        except (AssertionError, ValueError) as exc:
            raise ConfigError(f"env.players={cfg.players}: TextArena's {cfg.env_id} refuses it "
                              f"({' '.join(str(exc).split())[:160]})") from None
        game.state.error_allowance = 0 if cfg.illegal == "lose" else cfg.max_retries
        return game

    def make_task(self, seed: int) -> int:
        return seed

    def rules(self) -> str:
        game = self.cfg.env_id.split("-")[0]
        return f"You are playing {game} (TextArena); the game master's messages give the rules."

    def initial_state(self, task: int) -> ArenaState:
        game = self.reset_game(self.cfg, task)
        return self._drained(ArenaState(game, ((),) * self.players, illegal=(0,) * self.players))

    @staticmethod
    def _drained(state: ArenaState) -> ArenaState:
        """Move every message the library queued for a seat into the seat's log."""
        logs = list(state.logs)
        for seat in range(len(logs)):
            pending = state.game.state.observations.get(seat, [])
            logs[seat] += tuple(f"[{'GAME' if sender == -1 else f'Player {sender}'}] {message}"
                                for sender, message, _ in pending)
            state.game.state.observations[seat] = []
        return replace(state, logs=tuple(logs))

    def seat(self, state: ArenaState) -> int | None:
        return None if state.over else state.game.state.current_player_id

    def legal_moves(self, state: ArenaState) -> list[str]:
        """TextArena names no move list: its game master's messages say what is allowed."""
        return []

    def view(self, state: ArenaState, seat: int) -> str:
        return "\n".join(state.logs[seat]) or "(nothing yet)"

    def move(self, state: ArenaState, action: str | None) -> Transition:
        """Pass the seat to move's ``action`` to the library; a refused (or missing) one by ``env.illegal``."""
        seat = state.game.state.current_player_id
        game = copy.deepcopy(state.game)
        errors = getattr(game.state, "error_count", 0)
        with own_random():
            if action is None:  # refused by marl, counted by the library's own rule
                game.state.set_invalid_move(reason="no move after the answer marker.")
                game.state.step()
            else:
                game.step(action=action)
        forfeited = bool(game.state.done and game.state.game_info.get(seat, {}).get("invalid_move"))
        refused = forfeited or getattr(game.state, "error_count", 0) > errors
        illegal = tuple(n + (p == seat and refused) for p, n in enumerate(state.illegal))
        new = self._drained(replace(state, game=game, illegal=illegal, forfeit=seat if forfeited else None))
        penalty = self.cfg.retry_penalty if refused and not forfeited else 0.0
        return Transition(new, penalty, new.over, new.over and not forfeited, not refused, {"illegal": float(refused)})

    def outcome(self, state: ArenaState) -> list[float]:
        """The library's rewards."""
        rewards = state.game.state.rewards or {}
        return [float(rewards.get(p, 0.0)) for p in range(self.players)]

