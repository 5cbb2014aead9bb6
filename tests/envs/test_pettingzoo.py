"""PettingZoo AEC envs through marl's adapter, checked against the library itself: random games played move for move
through marl and through PettingZoo's own loop (``agent_iter``, ``last``, ``step``) give the same seat to move, the
same legal moves and observations, the same end and the same rewards, illegal and malformed answers included; a
position can be played many ways; bad settings fail in one line; a tiny AT-GRPO team trains and is evaluated."""

import random
import sys

import numpy as np
import pettingzoo
import pytest
from omegaconf import OmegaConf
from pettingzoo.utils.wrappers import BaseWrapper, TerminateIllegalWrapper

from marl_cli.envs.pettingzoo import PettingZooConfig, PettingZooEnv
from marl_cli.training.loop import train
from tests.helpers import TINY, refusal, torch_threads, train_config

HANABI = {"colors": 2, "ranks": 2, "hand_size": 2, "max_information_tokens": 3, "max_life_tokens": 1}
ENVS = {  # env id: its arguments, games played under each illegal-move rule (chess, long with retries: lose only)
    "classic/tictactoe_v3": ({}, 200),
    "classic/connect_four_v3": ({}, 30),
    "classic/rps_v2": ({"max_cycles": 5}, 100),
    "classic/leduc_holdem_v4": ({}, 150),
    "classic/texas_holdem_v4": ({}, 50),
    "classic/texas_holdem_no_limit_v6": ({}, 50),
    "classic/hanabi_v5": (HANABI, 30),
    "classic/go_v5": ({"board_size": 5}, 8),
    "classic/chess_v6": ({}, 3),
}
RUNS = [(env_id, illegal) for env_id in ENVS for illegal in ("lose", "retry") if (env_id, illegal) != (
    "classic/chess_v6", "retry")]
BAD = 0.06  # the share of answers that are illegal or malformed
MALFORMED = [None, "", "pass", "move please", "-1", "1.5", "e2e9", "[]"]


def env_of(env_id: str, kwargs: dict | None = None, **settings) -> PettingZooEnv:
    return PettingZooEnv(OmegaConf.structured(PettingZooConfig(env_id=env_id, kwargs=kwargs or {}, **settings)),
                         seed=5)


def legal_actions(ref, agent: str, observation) -> list[int]:
    """The library's legal actions: its action mask (the observation's, else the info's), else its whole space."""
    mask = observation.get("action_mask") if isinstance(observation, dict) else None
    if mask is None:
        mask = ref.infos[agent].get("action_mask")
    return [int(a) for a in np.flatnonzero(mask)] if mask is not None else list(range(ref.action_space(agent).n))


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


def terminates_illegal(ref) -> bool:
    """Whether the env wraps itself in PettingZoo's rule for a masked action (−1 for the offender, 0 for others)."""
    while isinstance(ref, BaseWrapper):
        if isinstance(ref, TerminateIllegalWrapper):
            return True
        ref = ref.env
    return False


def spoken(env: PettingZooEnv, state, legal: list[int], action: int, rng: random.Random) -> str:
    """A legal ``action`` as a model might answer it: its name (or number) with case, spaces, brackets, a stop."""
    name = env.legal_moves(state)[legal.index(action)]
    if env.namer and rng.random() < 0.3:
        name = str(action)
    return rng.choice([name, name.upper(), name.lower(), f" [{name}]. ", f"'{name}'"])


def bad_answer(legal: list[int], size: int, rng: random.Random) -> tuple[str | None, int | None]:
    """An illegal answer, and the library's action for it where it has one (a masked action)."""
    masked = [a for a in range(size) if a not in legal]
    roll = rng.random()
    if masked and roll < 0.5:
        action = rng.choice(masked)
        return str(action), action
    if roll < 0.7:
        return str(size + rng.randrange(3)), None
    return rng.choice(MALFORMED), None


def play_both(env: PettingZooEnv, seed: int, rng: random.Random, played: dict[str, int]) -> None:
    """One random game through marl and, move for move, through the library's own loop; ``played`` counts the
    legal moves, the bad answers and the forfeits the library's own rule for a masked action also played out."""
    ours = env.initial_state(seed)
    ref = pettingzoo.make("aec", env.cfg.env_id, **env.cfg.kwargs)
    ref.reset(seed=seed)
    paid = dict.fromkeys(ref.possible_agents, 0.0)
    for agent in ref.agent_iter():
        observation, reward, terminated, truncated, _ = ref.last()
        paid[agent] += reward
        if terminated or truncated:
            ref.step(None)
            continue
        seat, legal = ref.possible_agents.index(agent), legal_actions(ref, agent, observation)
        assert not ours.over and env.seat(ours) == seat
        assert env.actions(ours) == legal and len(env.legal_moves(ours)) == len(legal)
        assert same(ours.game.unwrapped.observe(agent), observation)
        while rng.random() < BAD:
            played["bad"] += 1
            answer, action = bad_answer(legal, ref.action_space(agent).n, rng)
            step = env.step(ours, answer)
            assert not step.format_ok and step.info["illegal"] == 1.0
            ours = step.state
            if env.cfg.illegal == "retry":  # the library never sees it: the same seat moves again
                assert (step.reward, step.done, env.seat(ours), env.actions(ours)) == (-0.1, False, seat, legal)
                continue
            assert step.done and ours.forfeit == seat and env.score(ours) == 0.0
            unpaid = not any(paid.values()) and not any(ref.unwrapped._cumulative_rewards.values())
            if action is None or not (terminates_illegal(ref) and unpaid):
                assert env.returns(ours) == [-1.0 if p == seat else 0.0 for p in range(env.players)]
                return
            ref.step(action)  # the library's own rule for a masked action: the same outcome
            played["mirrored"] += 1
            break
        else:
            action = rng.choice(legal)
            ours = env.step(ours, spoken(env, ours, legal, action, rng)).state
            ref.step(action)
            played["moves"] += 1
    assert ours.over and env.returns(ours) == [paid[a] for a in ref.possible_agents]


@pytest.mark.parametrize(("env_id", "illegal"), RUNS)
def test_random_games_equal_the_librarys_own_play(env_id, illegal):
    kwargs, games = ENVS[env_id]
    env = env_of(env_id, kwargs, illegal=illegal, illegal_reward=-1.0, illegal_others=0.0, max_retries=10**6)
    rng, played = random.Random(f"{env_id}/{illegal}"), {"moves": 0, "bad": 0, "mirrored": 0}
    for seed in range(games):
        play_both(env, seed, rng, played)
    print(f"{env_id} illegal={illegal}: {games} games, {played['moves']} legal moves, {played['bad']} bad answers "
          f"({played['mirrored']} forfeits the library's own rule also ended)")
    assert played["moves"] >= games and played["bad"] >= 1


def test_a_position_can_be_played_many_ways_and_the_original_stays_as_it_was():
    for env_id, kwargs in [("classic/hanabi_v5", HANABI), ("classic/leduc_holdem_v4", {}), ("classic/chess_v6", {})]:
        env = env_of(env_id, kwargs)
        state = env.step(env.initial_state(2), env.legal_moves(env.initial_state(2))[0]).state
        seen, legal = env.view(state, env.seat(state)), env.legal_moves(state)
        first = [env.step(state, move).state for move in legal]
        again = [env.step(state, move).state for move in legal]
        assert env.view(state, env.seat(state)) == seen and env.legal_moves(state) == legal
        for a, b in zip(first, again, strict=True):
            assert a.game is not b.game and a.moves == b.moves
            assert [env.view(a, p) for p in range(env.players)] == [env.view(b, p) for p in range(env.players)]


def test_illegal_moves_lose_by_the_rule_or_are_retried_with_a_penalty():
    env = env_of("classic/tictactoe_v3")
    state = env.step(env.initial_state(0), "4").state
    step = env.step(state, "4")  # taken
    assert step.done and not step.format_ok and env.returns(step.state) == [0.5, -1.5]
    assert env.step(state, None).state.forfeit == 1 and env.step(state, "center").state.forfeit == 1
    with pytest.raises(ValueError, match="the game is over"):
        env.step(step.state, "0")
    retry = env_of("classic/tictactoe_v3", illegal="retry", retry_penalty=-0.25, max_retries=1)
    again = retry.step(retry.initial_state(0), "9")
    assert (again.done, again.reward, retry.seat(again.state)) == (False, -0.25, 0)
    assert retry.step(again.state, "x").state.forfeit == 0  # the second illegal move loses


def test_a_game_cut_off_before_its_end_is_a_draw():
    env = env_of("classic/connect_four_v3")
    state = env.step(env.initial_state(0), "3").state
    assert not state.over and env.returns(state) == [0.0, 0.0] and env.score(state) == 0.0


def test_a_seat_sees_its_observation_or_the_text_render_and_never_a_blind_pick():
    ttt = env_of("classic/tictactoe_v3")
    state = ttt.step(ttt.initial_state(0), "4").state
    assert ttt.view(state, 1) == ("Moves so far: player_1: 4\nYour view (observation):\n"
                                  "plane 0:\n0 0 0\n0 0 0\n0 0 0\nplane 1:\n0 0 0\n0 1 0\n0 0 0")
    rps = env_of("classic/rps_v2")
    state = rps.step(rps.initial_state(0), "rock").state
    assert rps.legal_moves(state) == ["ROCK", "PAPER", "SCISSORS"]
    assert rps.view(state, 1) == "Your moves so far: none yet\nYour view (observation):\n3"  # player_0's pick unseen
    assert rps.view(state, 0).startswith("Your moves so far: ROCK\n")
    chess = env_of("classic/chess_v6")
    start = chess.initial_state(0)
    assert chess.loaded.view == "render" and "e2e4" in chess.legal_moves(start)
    assert chess.view(chess.step(start, "E2E4").state, 1).endswith("P P P P . P P P\nR N B Q K B N R")


def test_the_bots_play_legal_moves_from_the_position_alone():
    env = env_of("classic/connect_four_v3")
    state = env.initial_state(0)
    while not state.over:
        move = env.bot_move(state, "random")
        assert move in env.legal_moves(state) and move == env.bot_move(state, "random")
        state = env.step(state, move).state
    assert env.bot_move(state, "random") is None
    assert env.bot_move(env.initial_state(0), "first_legal") == "0"
    assert env.oracle(env.initial_state(0)) in env.legal_moves(env.initial_state(0))


GAME = ["~experiment", "env=pettingzoo", "workflow=game", "workflow.roles=[player_1,player_2]"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.env_id=classic/tictactoe_v9"], "env.env_id=classic/tictactoe_v9: no such PettingZoo env; similar: "
                                          "classic/tictactoe-v3"),
    (["env.env_id=classic/tictac"], "env.env_id=classic/tictac: no such PettingZoo env; similar: classic/tictactoe"),
    (["+env.kwargs.foo=1"], "env.kwargs={'foo': 1}: PettingZoo's classic/tictactoe_v3 refuses them (raw_env."),
    (["env.env_id=classic/rps_v2", "+env.kwargs.num_actions=4"], "env.kwargs={'num_actions': 4}: PettingZoo's "
                                                                 "classic/rps_v2 refuses them (The number of actions "
                                                                 "must be an odd number.)"),
    (["env.view=render"], "env.view=render needs a text (ansi) render; classic/tictactoe_v3 renders"),
    (["+env.kwargs.render_mode=human"], "env.kwargs.render_mode is marl's"),
    (["env.env_id=classic/hanabi_v5", "+env.kwargs.players=3"], "workflow.roles names 2 seats (player_1, player_2) "
                                                                "but classic/hanabi_v5 is played by 3"),
    (["env.env_id=tictactoe_v3"], "env.env_id=tictactoe_v3: no such PettingZoo env or module; similar: "
                                  "classic/tictactoe-v3"),
    (["env.env_id=pettingzoo.utils"], "env.env_id=pettingzoo.utils has no env(); marl plays AEC envs"),
    (["env.env_id=atari/pong_v3"], "env.env_id=atari/pong_v3 needs a package that is not installed (No module "
                                   "named 'multi_agent_ale_py'): pip install 'pettingzoo[atari]'"),
    (["+policy.scripted.player_2=mcts"], "policy.scripted.player_2=mcts: no such bot; choose from: random, "
                                         "first_legal"),
    (["env.eval_opponents=[minimax]"], "env.eval_opponents=minimax: no such bot; choose from: random, first_legal"),
    (["workflow=single_agent", "workflow.roles=[agent]"], "env=pettingzoo is a game: play it with workflow=game"),
])
def test_bad_settings_fail_in_one_line(overrides, message):
    assert message in refusal([*GAME, *overrides])


def test_a_parallel_only_module_and_a_missing_library_fail_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "simultaneous_env.py").write_text("def parallel_env(**kwargs):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "builds only a parallel env (parallel_env); marl plays AEC envs" in refusal(
        [*GAME, "env.env_id=simultaneous_env"])
    for name in [m for m in sys.modules if m == "pettingzoo" or m.startswith("pettingzoo.")]:
        monkeypatch.setitem(sys.modules, name, None)
    assert refusal(GAME) == "env=pettingzoo needs pettingzoo: pip install 'marl[pettingzoo]'"


def test_a_tiny_at_grpo_team_trains_on_tictactoe_and_is_evaluated_against_a_random_bot(tmp_path):
    cfg = train_config(*GAME, *TINY, "algorithm=at_grpo", "policy=per_role", "algorithm.num_generations=2",
                       "rollout.tasks_per_step=2", "rollout.max_new_tokens=4", "workflow.max_turns=5",
                       "env.eval_size=4", "env.eval_opponents=[random]", "trainer.steps=1",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=8", "logger=none",
                       "progress=false")
    with torch_threads(1):
        summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["env"] == "pettingzoo"
    assert sorted(summary["policies"]) == ["player_1", "player_2"]
    for seat in ("player_1", "player_2"):
        shares = [summary[f"eval/vs_random/{seat}/{k}"] for k in ("win", "draw", "loss")]
        assert sum(shares) == pytest.approx(1.0) and summary[f"eval/vs_random/{seat}/games"] == 4.0
