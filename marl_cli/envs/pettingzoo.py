"""Multi-agent environments from PettingZoo as games: any AEC env of the library's registry (``env=pettingzoo
env.env_id=classic/connect_four_v3``) or of a module with an AEC ``env()``, with its own arguments (``env.kwargs``),
each agent of its ``possible_agents`` a seat of ``workflow=game`` (``workflows/game.py``).

A task is the seed of the env's ``reset``. A state is a copy of the library's env after the moves so far: ``step``
copies it before stepping (``twin``), so a position can be played many ways. The seat to move is the env's
``agent_selection``; its legal moves are the actions its ``action_mask`` allows (the observation's, else the
info's; without one, every action of its discrete space), by the names the env gives them where marl knows where
to find them (``NAMES``: rock paper scissors, the RLCard poker games, chess's UCI moves, Hanabi's), else by number.
An answer is matched to a legal move by name or number (case, spaces, brackets and a final full stop ignored);
anything else, a malformed answer included, is an illegal move that never reaches the library, ruled by
``env.illegal`` (``games.py``: ``lose`` with ``env.illegal_reward`` for the offender and ``env.illegal_others``
for every other seat; ``retry`` with ``env.retry_penalty`` up to ``env.max_retries``). PettingZoo's own rule for a
masked action (``TerminateIllegalWrapper`` in its classic envs: −1 for the offender, 0 for the others, the game
over) is ``env.illegal_reward=-1 env.illegal_others=0``; marl's defaults are SPIRAL's −1.5/+0.5.

A seat's view (``env.view``) is the env's text render (``render_mode="ansi"``; ``auto`` picks it where the env
has one: it shows the whole state, as chess's board) or else a faithful text of the agent's own observation
(``describe``: every number of it, a board plane by plane, the action mask left out as the legal moves are listed),
after the moves so far: every seat's where every seat sees them (``PUBLIC_MOVES``), else only its own. Each seat's
return is what the library paid it over the game (the rewards ``last()`` reports before each of its steps and at
the end); the game is over once every agent is terminated or truncated. Agents done before the others take the
library's dead steps as they come up. A game cut off by ``workflow.max_turns`` is a draw. The bots are ``random``
and ``first_legal``.

PettingZoo is an optional dependency (``pip install 'marl[pettingzoo]'``), imported only when an env is built.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded, choices
from marl_cli.envs.base import ENVS, Transition
from marl_cli.envs.games import SIMPLE_BOTS, GameEnv, IllegalRule, normalise, require_game_workflow

INSTALL = "pip install 'marl[pettingzoo]'"
View = choices("View", "auto", "render", "observation", module=__name__)
MAX_VIEW = 20_000
"""The longest view (characters) marl shows a seat: an env whose view is longer (an image) is refused."""
PUBLIC_MOVES = ("tictactoe_v3", "connect_four_v3", "chess_v6", "go_v5", "leduc_holdem_v4", "texas_holdem_v4",
                "texas_holdem_no_limit_v6", "hanabi_v5")
"""Envs (by ``metadata["name"]``) whose moves every seat sees: a seat's view lists them all; in any other env
(rock paper scissors: a round's second pick is made blind) a seat's view lists its own moves only."""
RULES = {
    "tictactoe_v3": "Tic-tac-toe on a 3x3 board. Your view has two planes of 3 rows: plane 0 marks your pieces, "
                    "plane 1 your opponent's. A move is a cell's number 0-8: cell n is row n // 3, column n % 3 of "
                    "the planes. Three of yours in a row, column or diagonal wins (+1, the loser -1); a full board "
                    "is a draw (0).",
    "connect_four_v3": "Connect four on 6 rows by 7 columns. Your view has two planes of 6 rows (the top row "
                       "first): plane 0 marks your pieces, plane 1 your opponent's. A move is a column 0-6: your "
                       "piece drops to its lowest empty cell. Four of yours in a row, column or diagonal wins (+1, "
                       "the loser -1); a full board is a draw (0).",
    "rps_v2": "Rock paper scissors over rounds (15 unless env.kwargs.max_cycles says otherwise): each round both "
              "players pick a move, the second without seeing the first's. Rock beats scissors, scissors paper, "
              "paper rock: +1 to the winner and -1 to the loser of each round. Your view is your opponent's move "
              "in the last round (0 ROCK, 1 PAPER, 2 SCISSORS, 3 none yet).",
    "leduc_holdem_v4": "Leduc hold'em: cards J, Q, K, two of each; one private card each, a public card after the "
                       "first betting round. Moves: call, raise, fold, check. A pair with the public card wins, else "
                       "the higher card; chips won count in big blinds. Your view: 36 numbers, your card (J Q K), "
                       "the public card (J Q K), your chips (0-14), your opponent's chips (0-14).",
    "chess_v6": "Chess: the board as text, white upper case and black lower case, rank 8 at the top, '.' an empty "
                "square. A move is its UCI name (e2e4; a promotion adds its piece, e7e8q). Checkmate wins (+1, "
                "the loser -1); stalemate or a claimable draw is a draw (0).",
}
"""What a seat is told of the rules of the envs marl names (any other env: its name and what the view is)."""


def _rps_name(raw: Any, agent: str, action: int) -> str:
    return raw._moves[action]


def _rlcard_name(raw: Any, agent: str, action: int) -> str:
    actions = raw.env.actions
    return str(actions[action]) if isinstance(actions, list) else actions(action).name


def _chess_name(raw: Any, agent: str, action: int) -> str:
    from pettingzoo.classic.chess import chess_utils

    return chess_utils.action_to_move(raw.board, action, raw.possible_agents.index(agent)).uci()


def _hanabi_name(raw: Any, agent: str, action: int) -> str:
    return raw.hanabi_env.game_state.action_to_string(action)


NAMES: dict[str, Callable[[Any, str, int], str]] = {
    "rps_v2": _rps_name, "leduc_holdem_v4": _rlcard_name, "texas_holdem_v4": _rlcard_name,
    "texas_holdem_no_limit_v6": _rlcard_name, "chess_v6": _chess_name, "hanabi_v5": _hanabi_name,
}
"""Where the envs that name their actions keep the names (by ``metadata["name"]``): (raw env, agent, action) ->
the action's name in the position. Any other env's moves are their numbers."""


@dataclass
class PettingZooConfig(EnvConfig):
    """A PettingZoo AEC env (``pettingzoo.aec_registry``, or a module with an AEC ``env()``)."""

    name: str = "pettingzoo"
    # a registered id (family/name, e.g. classic/tictactoe_v3 or classic/tictactoe-v3), or the dotted path of a
    # module whose env() builds an AEC env
    env_id: str = "classic/tictactoe_v3"
    kwargs: dict[str, Any] = field(default_factory=dict)  # the env's own arguments, e.g. {max_cycles: 5}
    view: View = View.auto  # what a seat sees: render (the env's text render), observation (its own observation
    # as text); auto: the render where the env has a text one, else the observation
    rules: str = ""  # the rules text a seat reads; empty: marl's text for the env (RULES), else its name
    illegal: IllegalRule = IllegalRule.lose  # an illegal or unparsable move: the offender loses, or moves again
    illegal_reward: float = -1.5  # illegal=lose: the offender's return (SPIRAL's; PettingZoo's own rule: -1)
    illegal_others: float = 0.5  # illegal=lose: every other seat's return (PettingZoo's own rule: 0)
    retry_penalty: float = bounded(-0.1, le=0.0)  # illegal=retry: added to the reward of the illegal move's row
    max_retries: int = bounded(3, ge=0)  # illegal=retry: illegal moves in one game before illegal=lose applies
    eval_opponents: list[str] = field(default_factory=list)  # bots every evaluation also plays, a model in each seat


@dataclass(frozen=True)
class Loaded:
    """An env as configured: ``make`` builds a fresh one (not reset); its name, agents and the view a seat gets."""

    make: Callable[[], Any]
    name: str
    agents: tuple[str, ...]
    view: str


def constructor(env_id: str) -> Callable[..., Any]:
    """What builds the env ``env_id`` names (kwargs in, an env out); a one-line ConfigError for PettingZoo missing,
    an unknown id or module, a module that cannot be imported or a parallel-only env."""
    try:
        import pettingzoo
        from pettingzoo.env_registry.exceptions import FailedToImport, PettingZooRegistryError
    except ImportError:
        raise ConfigError(f"env=pettingzoo needs pettingzoo: {INSTALL}") from None
    try:
        spec = pettingzoo.spec("aec", env_id)
    except PettingZooRegistryError:
        if "/" not in env_id:
            return module_constructor(env_id)
        raise ConfigError(unknown(env_id)) from None

    def make(**kwargs: Any) -> Any:
        try:
            return pettingzoo.make("aec", spec, **kwargs)
        except FailedToImport as exc:
            raise ImportError(str(exc.__cause__ or exc)) from None

    return make


def unknown(env_id: str) -> str:
    """Why ``env_id`` names no AEC env of the registry (nor, without a family, a module): it is parallel only, or
    no env (with the ids it is close to)."""
    import pettingzoo
    from pettingzoo.env_registry.exceptions import PettingZooRegistryError

    try:
        pettingzoo.spec("parallel", env_id)
    except PettingZooRegistryError:
        near = difflib.get_close_matches(env_id, list(pettingzoo.aec_registry), n=4, cutoff=0.6)
        what = "no such PettingZoo env" + ("" if "/" in env_id else " or module")
        return f"env.env_id={env_id}: {what}" + (f"; similar: {', '.join(near)}" if near else
                                                 "; see pettingzoo.aec_registry")
    return f"env.env_id={env_id} is a parallel-only env; marl plays AEC envs (turn by turn)"


def module_constructor(path: str) -> Callable[..., Any]:
    """The ``env`` of the module at the dotted ``path``; a one-line ConfigError where there is no such module, it
    cannot be imported, or it builds only a parallel env."""
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name and path.startswith(exc.name):
            raise ConfigError(unknown(path)) from None
        raise ConfigError(f"env.env_id={path} needs {exc.name}, which is not installed") from None
    except ImportError as exc:
        raise ConfigError(f"env.env_id={path} cannot be imported ({' '.join(str(exc).split())[:160]})") from None
    if not callable(getattr(module, "env", None)):
        what = "builds only a parallel env (parallel_env)" if hasattr(module, "parallel_env") else "has no env()"
        raise ConfigError(f"env.env_id={path} {what}; marl plays AEC envs (turn by turn) built by a module's env()")
    return module.env


def install_hint(env_id: str) -> str:
    """How to install what the env ``env_id`` needs: marl's extra for the classic games, PettingZoo's for others."""
    family = env_id.split("/")[0] if "/" in env_id else ""
    return INSTALL if family in ("", "classic") else f"pip install 'pettingzoo[{family}]'"


def build(cfg: Any, make: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """An env from ``make(**kwargs)``, reset; a one-line ConfigError where the env refuses the arguments or lacks
    a dependency."""
    try:
        game = make(**kwargs)
        game.reset(seed=0)
    except ImportError as exc:
        raise ConfigError(f"env.env_id={cfg.env_id} needs a package that is not installed "
                          f"({' '.join(str(exc).split())[:160]}): {install_hint(cfg.env_id)}") from None
    except Exception as exc:  # an env refuses its arguments with any error type
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"env.kwargs={kwargs}: PettingZoo's {cfg.env_id} refuses them ({detail[:200]})") from None
    return game


def load(cfg: Any) -> Loaded:
    """The env ``cfg`` (the env's config) names, checked: it is an AEC env of discrete moves whose view marl can
    show, built with the arguments ``cfg.kwargs``. A one-line ConfigError for what it is not."""
    make = constructor(cfg.env_id)
    from gymnasium.spaces import Discrete
    from pettingzoo import AECEnv

    kwargs = OmegaConf.to_container(cfg.kwargs) if OmegaConf.is_config(cfg.kwargs) else dict(cfg.kwargs or {})
    kwargs = {str(k): v for k, v in kwargs.items()}
    if "render_mode" in kwargs:
        raise ConfigError("env.kwargs.render_mode is marl's: env.view=render shows the env's text (ansi) render")
    game = build(cfg, make, kwargs)
    if not isinstance(game, AECEnv):
        raise ConfigError(f"env.env_id={cfg.env_id} builds a {type(game).__name__}, not an AEC env; marl plays AEC "
                          "envs (turn by turn)")
    modes = list(game.metadata.get("render_modes", []))
    view = cfg.view if cfg.view != "auto" else ("render" if "ansi" in modes else "observation")
    if view == "render":
        if "ansi" not in modes:
            raise ConfigError(f"env.view=render needs a text (ansi) render; {cfg.env_id} renders {modes}: use "
                              "env.view=observation")
        kwargs["render_mode"] = "ansi"
        game = build(cfg, make, kwargs)
    for agent in game.possible_agents:
        if not isinstance(game.action_space(agent), Discrete):
            raise ConfigError(f"env.env_id={cfg.env_id}: {agent}'s actions are {game.action_space(agent)}; marl "
                              "plays envs of discrete moves")
    text = seat_text(game, view, game.agent_selection)
    if len(text) > MAX_VIEW:
        raise ConfigError(f"env.env_id={cfg.env_id}: a seat's {view} is {len(text)} characters as text (an image?); "
                          f"marl shows at most {MAX_VIEW}")
    return Loaded(functools.partial(make, **kwargs), game.metadata.get("name", cfg.env_id),
                  tuple(game.possible_agents), view)


def check_zoo(cfg: Any) -> None:
    """The env exists, takes its arguments and can be played; a game workflow plays it; the evaluation's bots
    exist."""
    require_game_workflow(cfg, "pettingzoo")
    load(cfg.env)
    for bot in cfg.env.eval_opponents:
        PettingZooEnv.check_bot(cfg.env, bot, "env.eval_opponents")


def number(value: Any) -> str:
    """One number of an observation: an integral value as an integer, else four significant digits."""
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, bool) or float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def describe(observation: Any) -> str:
    """A faithful text of an observation: a dict's entries by key (the ``action_mask`` left out: the legal moves
    are listed), an array's numbers (a vector on one line, a matrix row by row, a deeper array plane by plane
    along its last axis: a board's planes), anything not numeric as Python prints it."""
    import numpy as np

    if isinstance(observation, dict):
        parts = {k: v for k, v in observation.items() if k != "action_mask"}
        if list(parts) == ["observation"]:
            return describe(parts["observation"])
        return "\n".join(f"{k}:\n{describe(v)}" for k, v in parts.items())
    if isinstance(observation, (tuple, list)) and not all(np.isscalar(v) for v in observation):
        return "\n".join(f"[{i}]:\n{describe(v)}" for i, v in enumerate(observation))
    array = np.asarray(observation)
    if array.dtype.kind not in "biuf":
        return str(observation)
    if array.ndim <= 1:
        return " ".join(number(v) for v in array.reshape(-1))
    if array.ndim == 2:
        return "\n".join(describe(row) for row in array)
    return "\n".join(f"plane {c}:\n{describe(array[..., c])}" for c in range(array.shape[-1]))


def seat_text(game: Any, view: str, agent: str) -> str:
    """What ``agent`` sees of ``game``: its text render, or its own observation as text."""
    return str(game.render()) if view == "render" else describe(game.unwrapped.observe(agent))


def finished(game: Any) -> bool:
    """Every agent is terminated or truncated."""
    return all(game.terminations[a] or game.truncations[a] for a in game.agents)


SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
"""What a copy of an env shares with it (classes, modules, functions): never walked into."""


def twin(game: Any) -> Any:
    """A deep copy of the env ``game``. ``copy.deepcopy`` copies an object of Gymnasium's ``EzPickle`` (most
    PettingZoo envs, and objects they hold) as it pickles it, by its constructor's arguments: a fresh env, not the
    game in progress. Each such object reachable from ``game`` is copied attribute by attribute instead, all else
    as ``copy.deepcopy`` copies it, references among them kept."""
    from gymnasium.utils import EzPickle

    memo: dict[int, Any] = {}
    found, stack, seen = [], [game], set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, SHARED):
            continue
        seen.add(id(obj))
        if isinstance(obj, EzPickle):
            memo[id(obj)] = object.__new__(type(obj))
            found.append(obj)
        if isinstance(obj, dict):
            stack += obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += obj
        elif hasattr(obj, "__dict__"):
            stack += vars(obj).values()
    for obj in found:
        memo[id(obj)].__dict__.update(copy.deepcopy(vars(obj), memo))
    return copy.deepcopy(game, memo)


@dataclass(frozen=True)
class ZooState:
    """A PettingZoo game in progress: the library's env, the reset seed, what each seat collected before its moves
    (``totals``), who forfeited, each seat's illegal moves and the legal moves played (seat, name)."""

    game: Any
    seed: int
    totals: tuple[float, ...]
    forfeit: int | None = None
    illegal: tuple[int, ...] = ()
    moves: tuple[tuple[int, str], ...] = ()

    @property
    def over(self) -> bool:
        return self.forfeit is not None or finished(self.game)


@ENVS.register("pettingzoo", schema=PettingZooConfig, check=check_zoo)
class PettingZooEnv(GameEnv):
    """A PettingZoo AEC env; a task is its reset seed, its agents are ``workflow=game``'s seats."""

    library = "PettingZoo"
    bots = SIMPLE_BOTS

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.loaded = load(cfg)
        self.agents = list(self.loaded.agents)
        self.players = len(self.agents)
        self.namer = NAMES.get(self.loaded.name)
        self.public = self.loaded.name in PUBLIC_MOVES

    @staticmethod
    def seats(cfg: Any) -> int:
        return len(load(cfg).agents)

    def make_task(self, seed: int) -> int:
        return seed

    def rules(self) -> str:
        name = self.loaded.name
        return self.cfg.rules or RULES.get(name) or (f"{name} (PettingZoo): your view is the env's "
                                                     f"{self.loaded.view} as text; play one of the legal moves.")

    def initial_state(self, task: int) -> ZooState:
        game = self.loaded.make()
        game.reset(seed=task)
        return ZooState(game, task, (0.0,) * self.players, illegal=(0,) * self.players)

    def seat(self, state: ZooState) -> int | None:
        return None if state.over else self.agents.index(state.game.agent_selection)

    def actions(self, state: ZooState) -> list[int]:
        """The legal actions of the seat to move: those its action mask allows, or every one of its space."""
        import numpy as np

        game = state.game
        agent = game.agent_selection
        observation = game.unwrapped.observe(agent)
        mask = observation.get("action_mask") if isinstance(observation, dict) else None
        if mask is None:
            mask = game.infos[agent].get("action_mask")
        if mask is not None:
            return [int(a) for a in np.flatnonzero(mask)]
        space = game.action_space(agent)
        return list(range(int(space.start), int(space.start) + int(space.n)))

    def move_name(self, game: Any, action: int) -> str:
        """The name of ``action`` of the agent to move in ``game``: the env's where it names its actions, else its
        number."""
        return self.namer(game.unwrapped, game.agent_selection, action) if self.namer else str(action)

    def legal_moves(self, state: ZooState) -> list[str]:
        return [] if state.over else [self.move_name(state.game, a) for a in self.actions(state)]

    def view(self, state: ZooState, seat: int) -> str:
        """What ``seat`` sees: the moves so far (every seat's where all see them, ``PUBLIC_MOVES``; else its own)
        and the env's render or the seat's observation as text."""
        if self.public:
            moves = "Moves so far: " + (", ".join(f"{self.agents[p]}: {m}" for p, m in state.moves) or "none yet")
        else:
            moves = "Your moves so far: " + (", ".join(m for p, m in state.moves if p == seat) or "none yet")
        text = seat_text(state.game, self.loaded.view, self.agents[seat])
        return f"{moves}\nYour view ({self.loaded.view}):\n{text}"

    def chosen(self, state: ZooState, action: str | None) -> int | None:
        """The legal action ``action`` names (by name or number), or None."""
        if action is None:
            return None
        wanted, legal = normalise(action), self.actions(state)
        by_name = {normalise(self.move_name(state.game, a)): a for a in legal}
        if wanted in by_name:
            return by_name[wanted]
        return int(wanted) if re.fullmatch(r"[0-9]+", wanted) and int(wanted) in legal else None

    def move(self, state: ZooState, action: str | None) -> Transition:
        """Play the seat to move's ``action`` (a legal move's name or number) on a copy of the env; an illegal or
        missing one by ``env.illegal``."""
        seat = self.agents.index(state.game.agent_selection)
        chosen = self.chosen(state, action)
        if chosen is None:
            return self.refuse(state, seat)
        name = self.move_name(state.game, chosen)
        game, totals = twin(state.game), list(state.totals)
        self._play(game, chosen, totals)
        new = replace(state, game=game, totals=tuple(totals), moves=(*state.moves, (seat, name)))
        return Transition(new, 0.0, new.over, new.over, True, {"illegal": 0.0})

    def _play(self, game: Any, action: int, totals: list[float]) -> None:
        """Step ``game`` with ``action``, then the dead steps of agents done before the others (the AEC protocol),
        adding to ``totals`` what each agent collects: its cumulative reward before each of its steps, as
        ``last()`` reports it."""
        step: int | None = action
        while True:
            agent = game.agent_selection
            totals[self.agents.index(agent)] += float(game.unwrapped._cumulative_rewards[agent])
            game.step(step)
            if finished(game) or not (game.terminations[game.agent_selection]
                                      or game.truncations[game.agent_selection]):
                return
            step = None

    def outcome(self, state: ZooState) -> list[float]:
        """What the library paid each seat over the game: collected before its moves, plus its cumulative reward
        at the end."""
        cumulative = state.game.unwrapped._cumulative_rewards
        return [total + float(cumulative.get(agent, 0.0)) for total, agent in zip(state.totals, self.agents,
                                                                                   strict=True)]
