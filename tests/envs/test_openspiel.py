"""OpenSpiel games through marl's adapter, checked against the library itself: the same moves give the same states,
views, legal moves, ends and returns; deals follow the library's chance distribution; illegal moves follow the rule
the config names; the bots play the game."""

import math
import random
from collections import Counter

import pytest
from omegaconf import OmegaConf

from marl_cli.envs.openspiel import OpenSpielConfig, OpenSpielEnv, open_spiel_python

GAMES = {  # game, parameters, games played
    "tic_tac_toe": ({}, 600),
    "kuhn_poker": ({}, 600),
    "leduc_poker": ({}, 500),
    "connect_four": ({}, 200),
    "tiny_hanabi": ({}, 400),
    "hanabi": ({"players": 2, "colors": 2, "ranks": 2, "hand_size": 2, "max_information_tokens": 3,
                "max_life_tokens": 1}, 300),
}


def env_of(game: str, params: dict | None = None, **settings) -> OpenSpielEnv:
    cfg = OmegaConf.structured(OpenSpielConfig(game=game, params=params or {}, **settings))
    return OpenSpielEnv(cfg, seed=7)


def views(state, players: int) -> list[str]:
    kind = state.get_game().get_type()
    texts = []
    for p in range(players):
        texts.append(state.information_state_string(p) if kind.provides_information_state_string else "")
        texts.append(state.observation_string(p) if kind.provides_observation_string else "")
    return texts


def play_both(env: OpenSpielEnv, seed: int, rng: random.Random) -> int:
    """One random legal game through the adapter and, move for move, on the library's own state; the moves."""
    ours = env.initial_state(seed)
    ref = env.game.new_initial_state()
    moves = 0
    while True:
        while ref.is_chance_node():  # the deal the adapter drew, replayed on the library's state
            ref.apply_action(ours.game.history()[len(ref.history())])
        assert ref.history() == ours.game.history()
        assert ref.is_terminal() == ours.over
        assert views(ref, env.players) == views(ours.game, env.players)
        assert all(env.view(ours, p).endswith(text) for p, text in enumerate(views(ref, env.players)[
            (env.view_kind == "observation")::2]))
        if ref.is_terminal():
            assert env.returns(ours) == [float(r) for r in ref.returns()]
            assert env.score(ours) == 1.0
            return moves
        seat = ref.current_player()
        assert env.seat(ours) == seat
        names = [ref.action_to_string(seat, a) for a in ref.legal_actions()]
        assert env.legal_moves(ours) == names
        action = rng.choice(ref.legal_actions())
        step = env.step(ours, f"  {ref.action_to_string(seat, action).upper()}. ")  # case, spaces, a full stop
        assert step.format_ok and step.reward == 0.0
        ref.apply_action(action)
        ours, moves = step.state, moves + 1


@pytest.mark.parametrize("game", GAMES)
def test_random_legal_games_equal_the_librarys_own_play(game):
    params, n = GAMES[game]
    env, rng = env_of(game, params), random.Random(game)
    played = [play_both(env, seed, rng) for seed in range(n)]
    assert sum(played) >= n  # every game was played out, move by move


def test_deals_follow_the_librarys_chance_distribution():
    """Kuhn poker's six deals are equally likely: over n deals each count is within 5 binomial standard deviations
    of n/6 (a false alarm has probability below 1e-5 per count)."""
    env, n = env_of("kuhn_poker"), 6000
    deals = Counter(tuple(env.initial_state(seed).game.history()) for seed in range(n))
    sd = math.sqrt(n * (1 / 6) * (5 / 6))
    assert len(deals) == 6 and all(abs(c - n / 6) < 5 * sd for c in deals.values())


def test_the_k_games_of_one_task_share_their_deal():
    env = env_of("leduc_poker")
    first, second = env.initial_state(11), env.initial_state(11)
    assert first.game.history() == second.game.history() and first.game is not second.game
    calls = [env.step(s, "Call").state for s in (first, second)]  # the public card after the first round too
    calls = [env.step(s, "Call").state for s in calls]
    assert calls[0].game.history() == calls[1].game.history()


def test_an_illegal_move_loses_the_game_under_the_lose_rule():
    env = env_of("tic_tac_toe")
    state = env.step(env.initial_state(0), "x(1,1)").state
    step = env.step(state, "x(1,1)")  # taken (and the wrong mark)
    assert step.done and not step.format_ok and step.info["illegal"] == 1.0
    assert env.returns(step.state) == [0.5, -1.5] and env.score(step.state) == 0.0
    assert env.step(state, None).state.forfeit == 1  # no answer at all is illegal too


def test_an_illegal_move_is_retried_with_a_penalty_until_the_limit():
    env = env_of("kuhn_poker", illegal="retry", retry_penalty=-0.25, max_retries=2)
    state = env.initial_state(3)
    for _ in range(2):
        step = env.step(state, "Raise")
        assert (step.done, step.reward, env.seat(step.state)) == (False, -0.25, 0)
        state = step.state
    final = env.step(state, "Raise")
    assert final.done and final.state.forfeit == 0 and env.returns(final.state) == [-1.5, 0.5]


def test_a_game_cut_off_before_its_end_is_a_draw():
    env = env_of("connect_four")
    state = env.step(env.initial_state(0), "x3").state
    assert not state.over and env.returns(state) == [0.0, 0.0] and env.score(state) == 0.0


def test_a_seat_sees_the_board_in_a_game_of_perfect_information_else_its_information_state():
    assert (env_of("tic_tac_toe").view_kind, env_of("kuhn_poker").view_kind) == ("observation", "information_state")
    assert env_of("hanabi", GAMES["hanabi"][0]).view_kind == "observation"  # it has no information-state text
    assert env_of("kuhn_poker", view="observation").view_kind == "observation"


def test_the_bots_play_legal_moves_and_mcts_beats_random():
    env = env_of("tic_tac_toe", mcts_simulations=200)
    wins = 0
    for seed in range(10):
        state = env.initial_state(seed)
        while not state.over:
            bot = "mcts" if env.seat(state) == seed % 2 else "random"
            move = env.bot_move(state, bot)
            assert move in env.legal_moves(state)
            state = env.step(state, move).state
        wins += env.returns(state)[seed % 2] == 1.0
    assert wins >= 8
    assert env.bot_move(env.initial_state(0), "first_legal") == "x(0,0)"
    assert env.bot_move(env.initial_state(0), "minimax") in env.legal_moves(env.initial_state(0))


def _bet_by_card(info: str) -> float:
    """A hand-built Kuhn policy: the probability of Bet by card and by what the seat faces."""
    card, history = int(info[0]), info[1:]
    facing_bet = history.endswith("b")
    return [[0.2, 0.0], [0.5, 0.4], [0.9, 1.0]][card][facing_bet]


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker"])
def test_the_nash_conv_of_a_tabular_policy_equals_openspiels(game):
    policy, exploitability = open_spiel_python("policy"), open_spiel_python("algorithms.exploitability")

    env = env_of(game)
    rng = random.Random(5)
    reference = policy.TabularPolicy(env.game)
    for row, state in enumerate(reference.states):  # a random distribution over each state's legal moves
        weights = [rng.random() for _ in state.legal_actions()]
        reference.action_probability_array[row] = 0.0
        reference.action_probability_array[row, state.legal_actions()] = [w / sum(weights) for w in weights]

    def probabilities(positions):
        out = []
        for pos in positions:
            seat = pos.game.current_player()
            row = reference.state_lookup[pos.game.information_state_string(seat)]
            out.append({pos.game.action_to_string(seat, a): reference.action_probability_array[row, a]
                        for a in pos.game.legal_actions()})
        return out

    assert env.nash_conv(probabilities) == pytest.approx(exploitability.nash_conv(env.game, reference), abs=1e-12)


def test_kuhn_poker_uniform_play_has_nash_conv_0_9167_and_a_hand_built_policy_its_own():
    policy, exploitability = open_spiel_python("policy"), open_spiel_python("algorithms.exploitability")

    env = env_of("kuhn_poker")

    def uniform(positions):
        return [{m: 1 / len(env.legal_moves(p)) for m in env.legal_moves(p)} for p in positions]

    def by_card(positions):
        probs = []
        for p in positions:
            bet = _bet_by_card(p.game.information_state_string(p.game.current_player()))
            probs.append({"Bet": bet, "Pass": 1.0 - bet})
        return probs

    assert env.nash_conv(uniform) == pytest.approx(11 / 12, abs=1e-12)
    reference = policy.TabularPolicy(env.game)
    for info, row in reference.state_lookup.items():
        reference.action_probability_array[row] = [1.0 - _bet_by_card(info), _bet_by_card(info)]  # Pass = 0, Bet = 1
    assert env.nash_conv(by_card) == pytest.approx(exploitability.nash_conv(env.game, reference), abs=1e-12)
    with pytest.raises(ValueError, match="not a distribution"):
        env.nash_conv(lambda positions: [{"Bet": 0.7} for _ in positions])


def test_a_mixture_deals_its_games_in_turn_each_with_its_own_rules_and_exact_nash_conv():
    policy, exploitability = open_spiel_python("policy"), open_spiel_python("algorithms.exploitability")

    env = OpenSpielEnv(OmegaConf.structured(OpenSpielConfig(mixture=["kuhn_poker", "leduc_poker(players=2)"])), 7)
    tasks = [env.task("train", i) for i in range(4)]
    assert [kind for kind, _ in tasks] == [0, 1, 0, 1] and env.names == ["kuhn_poker", "leduc_poker"]
    states = [env.initial_state(t) for t in tasks]
    assert [s.game.get_game().get_type().short_name for s in states[:2]] == ["kuhn_poker", "leduc_poker"]
    assert env.rules_for(states[1]).startswith("Leduc") and env.game_of(states[0]) == "kuhn_poker"
    assert env.step(states[1], "Call").info["game"] == 1.0

    def uniform(positions):
        return [{m: 1 / len(env.legal_moves(p)) for m in env.legal_moves(p)} for p in positions]

    leduc = env.kinds[1][1]
    assert env.nash_conv(uniform, kind=1) == pytest.approx(
        exploitability.nash_conv(leduc, policy.UniformRandomPolicy(leduc)), abs=1e-12)
