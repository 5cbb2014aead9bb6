"""Games from OpenSpiel as environments: any ``pyspiel`` game by name and parameters (``env=openspiel
env.game=kuhn_poker``), its rules, legal moves and outcomes exactly as the library has them.

A task is a deal: its seed. Chance nodes (cards dealt, a public card turned) are resolved as soon as they come up,
each by inverse-CDF sampling of the library's ``chance_outcomes()`` from a generator of (deal seed, how many chance
nodes came before), so the K games of one task share their deal wherever the moves agree (a group of K games
from one deal) and a run is reproducible from its seed. Seats see what the library lets them see: the seat's
``information_state_string`` (``env.view=information_state``) or ``observation_string`` (``observation``), after
the moves played so far (chance moves left out: what they reveal is in the seat's view), then the legal moves by
their library names. An answer is matched to a legal move's name (case, spaces, brackets and a final full stop
ignored); anything else is an illegal move (``env.illegal``): ``lose`` ends the game, the offender scoring
``env.illegal_reward`` and every other seat ``env.illegal_others`` (SPIRAL's rule: −1.5 and +0.5 in training);
``retry`` leaves the state as it was for the same seat to move again, with ``env.retry_penalty`` on that row,
and after ``env.max_retries`` illegal moves in one game applies ``lose``. A game cut off by ``workflow.max_turns``
scores 0 for every seat (a draw).

Seats are the roles of ``workflow=game`` (``workflows/game.py``), which writes each seat's outcome onto its rows
when the game ends. The bots a scripted seat can play (``random``, ``first_legal``, ``mcts``, ``minimax``) are
here too (``OpenSpielEnv.bot_move``); OpenSpiel's MCTS needs a game of perfect information, its minimax (alpha-beta
to ``env.minimax_depth``, 0 beyond) a deterministic two-player zero-sum one (``check_bot``).
OpenSpiel is an optional dependency (``pip install 'marl[games]'``), imported only when a game is built.
"""

from __future__ import annotations

import difflib
import importlib
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded, choices
from marl_cli.envs.base import ENVS, Transition, task_seed
from marl_cli.envs.games import GameEnv, IllegalRule, normalise, require_game_workflow

INSTALL = "pip install 'marl[games]'"
View = choices("View", "auto", "information_state", "observation", module=__name__)
BOTS = ("random", "first_legal", "mcts", "minimax")
"""The scripted players a game offers (``policy.scripted.<seat>=<bot>``)."""
RULES = {
    "kuhn_poker": "Kuhn poker: a deck of three cards (0 = Jack, 1 = Queen, 2 = King); each player antes 1 chip and "
                  "gets one card. Players act in turn: Pass (check, or fold facing a bet) or Bet (bet 1, or call a "
                  "bet). After a bet and a call, or two passes, the higher card wins the pot; a fold loses it. Your "
                  "view is your card, then the moves so far (p = Pass, b = Bet).",
    "leduc_poker": "Leduc hold'em: six cards, two suits of Jack, Queen, King; one private card each, one public "
                   "card after the first betting round. Fold, Call or Raise (at most two raises a round); a pair "
                   "with the public card wins, else the higher card.",
    "tic_tac_toe": "Tic-tac-toe on a 3x3 board: x moves first; a move names the mark and the cell as "
                   "mark(row,column); three in a row, column or diagonal wins, a full board is a draw.",
    "connect_four": "Connect four on 6 rows by 7 columns: a move drops your piece into a column (x0 ... x6 or "
                    "o0 ... o6); four in a row, column or diagonal wins.",
    "hanabi": "Hanabi, cooperative: you see your partner's cards but not your own; play cards in rank order per "
              "colour, reveal a colour or rank to your partner (uses an information token), or discard; the team "
              "scores the fireworks built.",
    "tiny_hanabi": "Tiny Hanabi, cooperative: each player sees a private signal and picks an action; both score the "
                   "same payoff.",
}
"""What a seat is told of the rules of the games marl names (any other game: the library's long name only)."""
EXACT_GAMES = ("kuhn_poker", "leduc_poker", "tiny_hanabi", "tic_tac_toe")
"""Games small enough for ``env.nash_conv``: every information state is scored by the model at each evaluation."""
PUBLIC_MOVES = ("kuhn_poker", "leduc_poker", "hanabi", "tiny_hanabi")
"""Games of hidden information whose moves every seat sees (bets, hints): a seat's view lists them, as it does in
every game of perfect information; in any other game the library's text for the seat is all it sees."""


@dataclass
class OpenSpielConfig(EnvConfig):
    """A game from OpenSpiel (``pyspiel.registered_names()``)."""

    name: str = "openspiel"
    game: str = "kuhn_poker"  # the game's OpenSpiel name
    params: dict[str, Any] = field(default_factory=dict)  # its parameters, e.g. {players: 3} (the library's own)
    view: View = View.auto  # what a seat sees; auto: the observation (the board) in a game of perfect information,
    # else the information state (a seat's private cards and the history it saw)
    rules: str = ""  # the rules text a seat reads; empty: marl's text for the game (RULES), else its long name
    illegal: IllegalRule = IllegalRule.lose  # an illegal or unparsable move: the offender loses, or moves again
    illegal_reward: float = -1.5  # illegal=lose: the offender's return (SPIRAL's training rule)
    illegal_others: float = 0.5  # illegal=lose: every other seat's return
    retry_penalty: float = bounded(-0.1, le=0.0)  # illegal=retry: added to the reward of the illegal move's row
    max_retries: int = bounded(3, ge=0)  # illegal=retry: illegal moves in one game before illegal=lose applies
    mcts_simulations: int = bounded(100, ge=1)  # the mcts bot's simulations per move
    mcts_rollouts: int = bounded(4, ge=1)  # the mcts bot's random rollouts per leaf
    minimax_depth: int = bounded(4, ge=1)  # the minimax bot's search depth (heuristic 0 beyond it)
    nash_conv: bool = False  # every evaluation adds the exact NashConv of the policy the models induce (EXACT_GAMES)
    eval_opponents: list[str] = field(default_factory=list)  # bots every evaluation also plays, a model in each seat
    # several games in one run, e.g. [kuhn_poker, tic_tac_toe, "leduc_poker(players=2)"]: task i plays game i mod n
    # (each step deals its tasks round the mixture); each game keeps its own baselines and statistics (env.game and
    # env.params are then unused)
    mixture: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GameState:
    """A game in progress: the library's state at a decision node (or the end), never at a chance node.

    ``seed`` is the deal; ``chances`` the chance nodes resolved so far; ``forfeit`` the seat that lost by an
    illegal move; ``illegal`` the illegal moves of each seat; ``moves`` the legal moves played; ``kind`` which game
    of the mixture it is (0 without one).
    """

    game: Any
    seed: int
    chances: int = 0
    kind: int = 0
    forfeit: int | None = None
    illegal: tuple[int, ...] = ()
    moves: tuple[tuple[int, str], ...] = ()

    @property
    def over(self) -> bool:
        return self.forfeit is not None or self.game.is_terminal()


def load_game(cfg: Any) -> Any:
    """The pyspiel game ``cfg.game`` with ``cfg.params``; a one-line ConfigError for an unknown game, a parameter
    the game refuses, or OpenSpiel not installed."""
    try:
        import pyspiel
    except ImportError:
        raise ConfigError(f"env=openspiel needs OpenSpiel (the pyspiel module): {INSTALL}") from None
    if cfg.game not in pyspiel.registered_names():
        near = difflib.get_close_matches(cfg.game, pyspiel.registered_names(), n=4, cutoff=0.6)
        raise ConfigError(f"env.game={cfg.game}: no such OpenSpiel game" + (f"; similar: {', '.join(near)}" if near
                                                                              else "; see pyspiel.registered_names()"))
    params = {str(k): v for k, v in dict(cfg.params or {}).items()}
    try:
        return pyspiel.load_game(cfg.game, params)
    except Exception as exc:  # pyspiel raises its own error types for bad parameters
        detail = " ".join(str(exc).split())
        raise ConfigError(f"env.params={params}: OpenSpiel's {cfg.game} refuses them ({detail[:200]})") from None


def load_games(cfg: Any) -> list[tuple[str, Any]]:
    """The run's games by name: ``env.mixture``'s (each a name or ``name(param=value,...)``), else ``env.game``'s."""
    if not cfg.mixture:
        return [(cfg.game, load_game(cfg))]
    import pyspiel

    games = []
    for spec in cfg.mixture:
        name = spec.split("(")[0]
        if name not in pyspiel.registered_names():
            near = difflib.get_close_matches(name, pyspiel.registered_names(), n=4, cutoff=0.6)
            raise ConfigError(f"env.mixture names {spec}: no such OpenSpiel game" +
                              (f"; similar: {', '.join(near)}" if near else ""))
        try:
            games.append((name, pyspiel.load_game(spec)))
        except Exception as exc:  # pyspiel's own error types
            raise ConfigError(f"env.mixture names {spec}: OpenSpiel refuses it ({' '.join(str(exc).split())[:200]})") \
                from None
    seats = {name: game.num_players() for name, game in games}
    if len(set(seats.values())) > 1:
        raise ConfigError(f"env.mixture mixes games of different seat counts {seats}: one workflow has one role per "
                          "seat")
    return games


def check_game(cfg: Any) -> None:
    """The game exists, takes the parameters, sequential play is what marl can drive, a seat per role plays it."""
    require_game_workflow(cfg, "openspiel")
    for name, game in load_games(cfg.env):
        check_playable(cfg.env, name, game)


def check_playable(cfg: Any, name: str, game: Any) -> None:
    """Sequential play, the exactness asked for, the evaluation's bots and the view are what ``game`` offers."""
    import pyspiel

    kind = game.get_type()
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ConfigError(f"env.game={name} is a simultaneous-move game; marl plays sequential games (turn "
                          "by turn): choose another, or convert it with the library's turn-based wrapper")
    if cfg.nash_conv and name not in EXACT_GAMES:
        raise ConfigError(f"env.nash_conv=true enumerates every information state of the game; {name} is "
                          f"not one of the small games it is offered for: {', '.join(EXACT_GAMES)}")
    for bot in cfg.eval_opponents:
        check_bot(game, bot, "env.eval_opponents")
    view = seat_view(game, cfg.view)
    if view == "information_state" and not kind.provides_information_state_string:
        raise ConfigError(f"env.game={name} has no information-state text; use env.view=observation")
    if view == "observation" and not kind.provides_observation_string:
        raise ConfigError(f"env.game={name} has no observation text; use env.view=information_state")


def seat_view(game: Any, view: str) -> str:
    """The view ``env.view`` names for ``game`` (``auto``: the observation where the game hides nothing and has
    one, else the information state where it has one)."""
    if view != "auto":
        return view
    import pyspiel

    kind = game.get_type()
    perfect = kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION
    if (perfect and kind.provides_observation_string) or not kind.provides_information_state_string:
        return "observation"
    return "information_state"


def check_bot(game: Any, bot: str, where: str) -> None:
    """``bot`` (named at ``where``) can play ``game``: a one-line ConfigError otherwise."""
    import pyspiel

    kind = game.get_type()
    if bot not in BOTS:
        raise ConfigError(f"{where}={bot}: no such bot; choose from: {', '.join(BOTS)}")
    perfect = kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION
    if bot == "mcts" and not perfect:
        raise ConfigError(f"{where}=mcts searches the true state; {kind.short_name} hides information from its "
                          "players: use random or first_legal")
    two_player_zero_sum = game.num_players() == 2 and kind.utility == pyspiel.GameType.Utility.ZERO_SUM
    deterministic = kind.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC
    if bot == "minimax" and not (perfect and two_player_zero_sum and deterministic):
        raise ConfigError(f"{where}=minimax needs a deterministic two-player zero-sum game of perfect information; "
                          f"{kind.short_name} is not: use mcts, random or first_legal")


def open_spiel_python(module: str) -> Any:
    """``open_spiel.python.<module>``. It imports absl, whose log handler keeps the stderr of the moment and closes
    it when logging is reconfigured (``logging.config.dictConfig``: Hydra's, every job) unless it is the process's
    own; a run's stderr may be a tee or a captured stream then, so the handler is pointed at ``sys.__stderr__``."""
    loaded = importlib.import_module(f"open_spiel.python.{module}")
    from absl import logging as absl_logging

    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
    return loaded


@ENVS.register("openspiel", schema=OpenSpielConfig, check=check_game)
class OpenSpielEnv(GameEnv):
    """An OpenSpiel game; a task is its deal (a seed), seats are ``workflow=game``'s roles."""

    library = "OpenSpiel"
    bots = BOTS
    game_key = "game"

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        import pyspiel

        self.kinds = load_games(cfg)
        self.names = [name for name, _ in self.kinds]
        self.game = self.kinds[0][1]  # the game (a mixture's first)
        self.players = self.game.num_players()
        self.views = [seat_view(game, cfg.view) for _, game in self.kinds]
        self.view_kind = self.views[0]
        self.public = [name in PUBLIC_MOVES or game.get_type().information
                       == pyspiel.GameType.Information.PERFECT_INFORMATION for name, game in self.kinds]

    @staticmethod
    def seats(cfg: Any) -> int:
        """The seats of the game(s) ``cfg`` names."""
        return load_games(cfg)[0][1].num_players()

    @staticmethod
    def check_bot(cfg: Any, bot: str, where: str) -> None:
        for _, game in load_games(cfg):
            check_bot(game, bot, where)

    def task(self, split: str, index: int) -> tuple[int, int]:
        """Task ``index`` of ``split``: (which game of the mixture, i mod n; its deal's seed)."""
        return index % len(self.kinds), task_seed(split, index, self.seed)

    def make_task(self, seed: int) -> tuple[int, int]:
        return 0, seed

    def rules(self, kind: int = 0) -> str:
        name, game = self.kinds[kind]
        return self.cfg.rules or RULES.get(name, game.get_type().long_name)

    def rules_for(self, state: GameState) -> str:
        return self.rules(state.kind)

    def game_of(self, state: GameState) -> str:
        return self.names[state.kind]

    def initial_state(self, task: tuple[int, int] | int) -> GameState:
        """The deal of ``task``: (game of the mixture, seed), or a seed of the first game."""
        kind, seed = task if isinstance(task, tuple) else (0, task)
        start = GameState(self.kinds[kind][1].new_initial_state(), seed, kind=kind, illegal=(0,) * self.players)
        return self._settle_chance(start)

    def _settle_chance(self, state: GameState) -> GameState:
        """Resolve chance nodes from the deal's generator until a player is to move (or the game is over)."""
        game, chances = state.game, state.chances
        while game.is_chance_node():
            outcomes = game.chance_outcomes()
            u = random.Random(f"marl-chance/{state.seed}/{chances}").random()
            total, pick = 0.0, outcomes[-1][0]
            for action, p in outcomes:
                total += p
                if u < total:
                    pick = action
                    break
            game.apply_action(pick)
            chances += 1
        return replace(state, game=game, chances=chances)

    def seat(self, state: GameState) -> int | None:
        return None if state.over else state.game.current_player()

    def legal_moves(self, state: GameState) -> list[str]:
        """The names of the legal moves of the seat to move (none when the game is over)."""
        if state.over:
            return []
        seat = state.game.current_player()
        return [state.game.action_to_string(seat, a) for a in state.game.legal_actions()]

    def view(self, state: GameState, seat: int) -> str:
        """What ``seat`` sees: the moves so far (each seat's, by name, where every seat sees them:
        ``PUBLIC_MOVES``) and the library's text for the seat."""
        game = state.game
        view = self.views[state.kind]
        text = game.information_state_string(seat) if view == "information_state" else game.observation_string(seat)
        mine = f"Your view ({view.replace('_', ' ')}): {text or '(empty)'}"
        if not self.public[state.kind]:
            return mine
        moves = ", ".join(f"player_{p}: {name}" for p, name in state.moves) or "none yet"
        return f"Moves so far: {moves}\n{mine}"

    def move(self, state: GameState, action: str | None) -> Transition:
        """Play the seat to move's ``action`` (a legal move's name); an illegal or missing one by ``env.illegal``."""
        seat = state.game.current_player()
        wanted = normalise(action) if action else None
        legal = {normalise(state.game.action_to_string(seat, a)): a for a in state.game.legal_actions()}
        if wanted in legal:
            game = state.game.clone()
            name = game.action_to_string(seat, legal[wanted])
            game.apply_action(legal[wanted])
            new = self._settle_chance(replace(state, game=game, moves=(*state.moves, (seat, name))))
            return Transition(new, 0.0, new.over, new.over, True, {"illegal": 0.0, "game": float(state.kind)})
        return self.refuse(state, seat, {"game": float(state.kind)})

    def outcome(self, state: GameState) -> list[float]:
        """The library's returns."""
        return [float(r) for r in state.game.returns()]

    def position(self, state: Any, kind: int = 0) -> GameState:
        """The library's ``state`` of game ``kind`` (a decision node reached by any history) as a position marl
        renders."""
        replay, moves, chances = self.kinds[kind][1].new_initial_state(), [], 0
        for action in state.history():
            if replay.is_chance_node():
                chances += 1
            else:
                seat = replay.current_player()
                moves.append((seat, replay.action_to_string(seat, action)))
            replay.apply_action(action)
        return GameState(state.clone(), 0, chances, kind, illegal=(0,) * self.players, moves=tuple(moves))

    def nash_conv(self, probabilities: Callable[[list[GameState]], list[dict[str, float]]], kind: int = 0) -> float:
        """The NashConv of the policy ``probabilities`` gives: called with one position per information state
        where a seat moves (OpenSpiel's ``TabularPolicy`` order), it returns each one's probability of every
        legal move by name. The sum over seats of what a best response to the others gains over the policy's own
        value, computed exactly by OpenSpiel (0 at a Nash equilibrium; Kuhn poker's uniform policy: 0.9167). ``kind``:
        which game of the mixture."""
        policy, exploitability = open_spiel_python("policy"), open_spiel_python("algorithms.exploitability")

        game = self.kinds[kind][1]
        table = policy.TabularPolicy(game)
        positions = [self.position(state, kind) for state in table.states]
        for row, (state, probs) in enumerate(zip(table.states, probabilities(positions), strict=True)):
            seat, legal = state.current_player(), state.legal_actions()
            given = [float(probs.get(state.action_to_string(seat, a), 0.0)) for a in legal]
            if abs(sum(given) - 1.0) > 1e-6 or min(given) < 0.0:
                raise ValueError(f"the move probabilities at information state {state.information_state_string()!r} "
                                 f"are not a distribution over its legal moves: {probs}")
            table.action_probability_array[row] = 0.0
            table.action_probability_array[row, legal] = given
        return float(exploitability.nash_conv(game, table))

    def bot_move(self, state: GameState, bot: str) -> str | None:
        """The move ``bot`` (``BOTS``) plays in ``state``, by name; None when the game is over."""
        if state.over:
            return None
        game, seat = state.game, state.game.current_player()
        rng = random.Random(f"marl-bot/{bot}/{state.seed}/{game.history_str()}/{sum(state.illegal)}")
        if bot == "random":
            action = rng.choice(game.legal_actions())
        elif bot == "first_legal":
            action = game.legal_actions()[0]
        elif bot == "mcts":
            action = self._mcts(game.get_game(), rng).step(game.clone())
        elif bot == "minimax":
            action = self._minimax(game, seat)
        else:
            raise ValueError(f"unknown bot {bot!r}; choose from: {', '.join(BOTS)}")
        return game.action_to_string(seat, action)

    def _mcts(self, game: Any, rng: random.Random) -> Any:
        import numpy as np
        mcts = open_spiel_python("algorithms.mcts")

        state = np.random.RandomState(rng.getrandbits(31))
        evaluator = mcts.RandomRolloutEvaluator(self.cfg.mcts_rollouts, state)
        return mcts.MCTSBot(game, 2.0, self.cfg.mcts_simulations, evaluator, random_state=state, solve=True)

    def _minimax(self, game: Any, seat: int) -> int:
        minimax = open_spiel_python("algorithms.minimax")

        _, action = minimax.alpha_beta_search(game.get_game(), game.clone(), lambda s: 0.0, self.cfg.minimax_depth,
                                              seat)
        return action
