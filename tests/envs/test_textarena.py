"""TextArena games through marl's adapter, checked against the library itself: the same moves give the same
messages to every seat, the same seat to move, the same end and rewards; refused moves follow env.illegal; the
library's reseeding never leaks into Python's global generator."""

import random

import pytest
import textarena
from omegaconf import OmegaConf

from marl_cli.envs.textarena import TextArenaConfig, TextArenaEnv

MOVES = {  # candidate answers, legal and not, for random games
    "TicTacToe-v0-raw": [f"[{i}]" for i in range(9)] + ["[9]", "center please"],
    "KuhnPoker-v0-raw": ["[check]", "[bet]", "[call]", "[fold]", "[raise]"],
    "SimpleNegotiation-v0-raw": ["[Offer: 1 Wheat -> 1 Wood]", "[Offer: 2 Ore -> 3 Brick, 1 Sheep]", "[Accept]",
                                 "[Deny]", "let us trade", "[Offer: 1 Gold -> 1 Wood]"],
}


def env_of(env_id: str, **settings) -> TextArenaEnv:
    return TextArenaEnv(OmegaConf.structured(TextArenaConfig(env_id=env_id, **settings)), seed=3)


def _drain(game, logs):
    for seat in range(len(logs)):
        logs[seat] += [f"[{'GAME' if s == -1 else f'Player {s}'}] {m}" for s, m, _ in game.state.observations[seat]]
        game.state.observations[seat] = []


def play_both(env: TextArenaEnv, seed: int, rng: random.Random, allowance: int) -> int:
    ours = env.initial_state(seed)
    ref = textarena.make(env.cfg.env_id)
    ref.reset(num_players=2, seed=seed)
    ref.state.error_allowance = allowance
    logs = [[], []]
    _drain(ref, logs)
    for moves in range(200):
        assert [list(log) for log in ours.logs] == logs
        assert ours.over == ref.state.done
        if ref.state.done:
            invalid = [ref.state.game_info[p].get("invalid_move") for p in range(2)]
            if not any(invalid):
                assert env.returns(ours) == [float(ref.state.rewards[p]) for p in range(2)]
            else:
                assert ours.forfeit == invalid.index(True)
            return moves
        assert env.seat(ours) == ref.state.current_player_id
        move = rng.choice(MOVES[env.cfg.env_id])
        ours = env.step(ours, move).state
        ref.step(action=move)
        _drain(ref, logs)
    raise AssertionError("a game did not end in 200 moves")


@pytest.mark.parametrize("env_id", sorted(MOVES))
@pytest.mark.parametrize("illegal", ["lose", "retry"])
def test_random_games_equal_the_librarys_own_play(env_id, illegal):
    env, rng = env_of(env_id, illegal=illegal, max_retries=2), random.Random(env_id)
    before = random.getstate()
    played = [play_both(env, seed, rng, 0 if illegal == "lose" else 2) for seed in range(300)]
    assert sum(played) >= 300
    random.seed(0)  # the reference's resets reseeded the global generator; the adapter's never do
    state = random.getstate()
    env.initial_state(5)
    env.step(env.initial_state(5), "[4]")
    assert random.getstate() == state and before is not None


def test_a_refused_move_loses_under_lose_and_is_retried_with_a_penalty_under_retry():
    env = env_of("TicTacToe-v0-raw")
    step = env.step(env.initial_state(0), "[42]")
    assert step.done and not step.format_ok and step.state.forfeit is not None
    assert env.returns(step.state)[step.state.forfeit] == -1.5 and sum(env.returns(step.state)) == -1.0
    retry = env_of("TicTacToe-v0-raw", illegal="retry", retry_penalty=-0.3, max_retries=1)
    first = retry.initial_state(0)
    seat = retry.seat(first)
    again = retry.step(first, "[42]")
    assert (again.done, again.reward, again.format_ok, retry.seat(again.state)) == (False, -0.3, False, seat)
    assert retry.step(again.state, None).state.forfeit == seat  # no answer is refused too; the second refusal loses


def test_a_seat_reads_every_message_the_library_sent_it():
    env = env_of("SimpleNegotiation-v0-raw")
    state = env.initial_state(1)
    state = env.step(state, "[Offer: 1 Wheat -> 1 Wood]").state
    view = env.view(state, 1)
    assert view.startswith("[GAME] You are Player 1") and "[Player 0] [Offer: 1 Wheat -> 1 Wood]" in view
