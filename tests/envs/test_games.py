"""What the game envs share (``envs/games.py``), the same in each of them: the observation is the view of the seat
to move, no seat moves once the game is over, an illegal move forfeits by ``env.illegal``'s rewards, a forfeited
game scores 0, and a seat can be given only the bots the game has."""

import re

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.envs.openspiel import OpenSpielConfig, OpenSpielEnv
from marl_cli.envs.pettingzoo import PettingZooConfig, PettingZooEnv
from marl_cli.envs.textarena import TextArenaConfig, TextArenaEnv

GAMES = {  # a tic-tac-toe of each library: its env class, its config, an illegal move, a legal first move
    "openspiel": (OpenSpielEnv, OpenSpielConfig(game="tic_tac_toe"), "o(1,1)", "x(1,1)"),
    "textarena": (TextArenaEnv, TextArenaConfig(env_id="TicTacToe-v0-raw"), "[42]", "[4]"),
    "pettingzoo": (PettingZooEnv, PettingZooConfig(env_id="classic/tictactoe_v3"), "42", "4"),
}


def game(name: str, **settings):
    cls, cfg, illegal, legal = GAMES[name]
    cfg = OmegaConf.merge(OmegaConf.structured(cfg), settings)
    return cls(cfg, seed=1), illegal, legal


@pytest.mark.parametrize("name", GAMES)
def test_an_illegal_move_forfeits_by_the_rule_and_a_game_over_takes_no_move(name):
    env, illegal, legal = game(name, illegal_reward=-2.0, illegal_others=0.25)
    state = env.step(env.initial_state(0), legal).state
    assert env.observe(state) == env.view(state, env.seat(state)) == env.view(state, 1)
    step = env.step(state, illegal)
    assert step.done and not step.format_ok and step.info["illegal"] == 1.0 and step.state.forfeit == 1
    assert env.returns(step.state) == [0.25, -2.0] and env.score(step.state) == 0.0
    assert env.seat(step.state) is None and env.rules_for(step.state) == env.rules()
    with pytest.raises(ValueError, match="the game is over: no seat is to move"):
        env.step(step.state, legal)


@pytest.mark.parametrize("name", GAMES)
def test_a_retried_move_costs_the_penalty_and_the_same_seat_moves_again(name):
    env, illegal, _ = game(name, illegal="retry", retry_penalty=-0.5, max_retries=2)
    step = env.step(env.initial_state(0), illegal)
    assert (step.done, step.reward, step.format_ok, env.seat(step.state)) == (False, -0.5, False, 0)


@pytest.mark.parametrize(("name", "bot", "message"), [
    ("textarena", "random", "x=random: TextArena games have no bots in marl (OpenSpiel's do)"),
    ("pettingzoo", "mcts", "x=mcts: no such bot; choose from: random, first_legal"),
    ("openspiel", "alphazero", "x=alphazero: no such bot; choose from: random, first_legal, mcts, minimax"),
])
def test_a_seat_gets_only_a_bot_its_game_has(name, bot, message):
    cls, cfg, _, _ = GAMES[name]
    with pytest.raises(ConfigError, match=re.escape(message)):
        cls.check_bot(OmegaConf.structured(cfg), bot, "x")
    if name != "textarena":
        cls.check_bot(OmegaConf.structured(cfg), "first_legal", "x")
