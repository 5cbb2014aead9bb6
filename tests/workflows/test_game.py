"""workflow=game over env=openspiel: the seat to move acts, each seat's outcome lands on its rows, bots fill seats
and never train, evaluation reports wins, draws and losses per seat and the exact NashConv of the induced policy."""

import math
import random
from types import SimpleNamespace

import pytest
import torch

from marl_cli.core.scoring import completion_logprobs
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling, encode_prompts
from marl_cli.rollout.induced import move_probabilities
from marl_cli.training.build import build_run, build_team
from marl_cli.training.evaluation import evaluate
from marl_cli.training.loop import train
from marl_cli.workflows.base import TeamState
from marl_cli.workflows.game import wilson
from tests.helpers import TINY, ScriptedGenerator, metric_records, refusal, train_config

GAME = ["~experiment", *TINY, "env=openspiel", "workflow=game", "env.eval_size=6", "rollout.tasks_per_step=3",
        "rollout.max_new_tokens=8", "algorithm.num_generations=2", "logger=none", "progress=false"]


def _play(game: str, answer, *overrides: str, k: int = 2):
    workflow = build_team(train_config(*GAME, f"env.game={game}", *overrides))
    policies = {"shared": SimpleNamespace(name="shared")}
    rollout = Rollout(workflow, policies, dict.fromkeys(workflow.roles, "shared"), ScriptedGenerator(answer),
                      Sampling(1.0))
    return workflow, rollout.play([workflow.env.task("train", i) for i in range(4)], k, random.Random(0))


def test_the_seat_to_move_acts_and_each_seat_gets_its_return_on_every_row():
    workflow, result = _play("kuhn_poker", lambda *a: "#### Bet")  # bet, call: the higher card wins 2
    assert len(result.samples) == 4 * 2 * 2 and all(ep.done and ep.success for ep in result.episodes)
    for ep in result.episodes:
        rows = {s.role: s for s in result.samples if (s.task, s.branch) == (ep.task, ep.branch)}
        returns = workflow.env.returns(ep.state.env)
        assert [rows[r].reward for r in workflow.roles] == returns and sorted(returns) == [-2.0, 2.0]
        assert [rows[r].success for r in workflow.roles] == [r > 0 for r in returns]
        assert all(rows[r].info["win"] == float(rows[r].success) and rows[r].info["draw"] == 0.0 for r in rows)
        assert [rows[r].turn for r in workflow.roles] == [0, 0]


def test_an_illegal_move_ends_the_game_for_the_offender_alone():
    _, result = _play("tic_tac_toe", lambda name, prompt, rng: "#### o(1,1)" if "You are player_1" in prompt
                      else "#### x(1,1)")
    for s in result.samples:
        if s.role == "player_1":  # o(1,1) is taken: player_1 loses its first move's game
            assert (s.reward, s.format_ok, s.info["illegal"], s.info["loss"]) == (-1.5, False, 1.0, 1.0)
        else:
            assert (s.reward, s.info["win"]) == (0.5, 1.0)


def test_retried_moves_carry_their_penalty_and_a_game_cut_off_is_a_draw():
    _, result = _play("connect_four", lambda *a: "#### nonsense", "env.illegal=retry", "env.max_retries=5",
                      "env.retry_penalty=-0.2", "workflow.max_turns=2", k=1)
    assert {s.role for s in result.samples} == {"player_0"}  # player_0 retries every turn; player_1 never moves
    assert all(s.reward == pytest.approx(-0.2) and s.info["truncated"] == 1.0 and s.info["draw"] == 1.0
               for s in result.samples)


def test_outcome_metrics_count_each_seats_games_with_a_wilson_interval():
    workflow, result = _play("kuhn_poker", lambda *a: "#### Bet", k=1)  # bet, call: the higher card wins
    finals = [ep.state for ep in result.episodes]
    metrics = workflow.outcome_metrics(finals, "eval")
    wins = sum(workflow.env.returns(f.env)[0] > 0 for f in finals)
    assert (metrics["eval/player_0/win"], metrics["eval/player_1/win"]) == (wins / 4, 1 - wins / 4)
    assert metrics["eval/player_0/draw"] == metrics["eval/player_0/illegal_loss"] == 0.0
    assert metrics["eval/games"] == 4.0
    low, high = wilson(0.6, 5)  # by hand: centre (0.6 + 0.3842) / 1.7683, half 1.96·sqrt(0.048 + 0.0384) / 1.7683
    assert (low, high) == pytest.approx(((0.9842 - 1.96 * math.sqrt(0.0864)) / 1.76832,
                                         (0.9842 + 1.96 * math.sqrt(0.0864)) / 1.76832), abs=1e-4)
    _, illegal = _play("kuhn_poker", lambda *a: "#### Fold", k=1)  # not a Kuhn move: player_0 forfeits
    forfeits = workflow.outcome_metrics([ep.state for ep in illegal.episodes], "eval")
    assert (forfeits["eval/player_0/illegal_loss"], forfeits["eval/player_1/win"]) == (1.0, 1.0)


def test_the_induced_policy_is_the_models_answer_probability_normalised_over_legal_moves(tmp_path):
    run = build_run(train_config(*GAME, "trainer.warmstart.enabled=false"), tmp_path)
    rollout, env = run.rollout, run.workflow.env
    positions = [env.initial_state(env.task("eval", i)) for i in range(3)]
    got = move_probabilities(rollout, positions)
    policy = run.policies["shared"]
    tok = policy.tokenizer
    prompt_ids, _ = encode_prompts(policy, [run.workflow.prompt("player_0", TeamState(p)) for p in positions],
                                   rollout.sampling.for_role("player_0"))
    for probs, prompt in zip(got, prompt_ids, strict=True):
        assert set(probs) == {"Pass", "Bet"} and sum(probs.values()) == pytest.approx(1.0, abs=1e-12)
        answers = [[*tok(f"#### {m}", add_special_tokens=False).input_ids, tok.eos_token_id] for m in ("Pass", "Bet")]
        with torch.no_grad():  # one sequence at a time, unpadded: the batched scoring must agree
            totals = [sum(completion_logprobs(policy.model, [prompt], [a], tok.pad_token_id, 1)[0]) for a in answers]
        expected = torch.softmax(torch.tensor(totals, dtype=torch.float64), 0).tolist()
        assert [probs["Pass"], probs["Bet"]] == pytest.approx(expected, abs=1e-5)


def test_self_play_trains_and_evaluation_reports_seats_and_nash_conv(tmp_path):
    summary = train(train_config(*GAME, "trainer.steps=1", "trainer.warmstart.enabled=true",
                                 "trainer.warmstart.num_examples=32", "env.nash_conv=true"), tmp_path)
    assert summary["status"] == "completed"
    assert 0.0 <= summary["eval/nash_conv"] <= 6.0  # Kuhn's payoffs lie in [-2, 2]: each best response gains < 3
    assert summary["eval/games"] == 6.0 and "eval/player_1/win_high" in summary
    assert summary["eval/player_0/win"] + summary["eval/player_0/draw"] + summary["eval/player_0/loss"] == \
        pytest.approx(1.0)


def test_a_bot_seat_plays_its_moves_and_never_trains(tmp_path):
    cfg = train_config(*GAME, "env.game=tic_tac_toe", "+policy.scripted.player_0=random", "trainer.steps=1",
                       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=32")
    summary = train(cfg, tmp_path)
    assert list(summary["policies"]) == ["shared"] and summary["policies"]["shared"] == ["player_1"]
    rows = []
    evaluate(build_run(cfg, tmp_path / "again"), "eval", rows=rows)
    bot = [s for s in rows if s.role == "player_0"]
    assert bot and all(s.format_ok and s.policy == "scripted:random" and not s.completion_ids for s in bot)


def test_evaluation_plays_each_bot_against_the_model_in_each_seat(tmp_path):
    run = build_run(train_config(*GAME, "env.game=tic_tac_toe", "env.eval_opponents=[random,first_legal]",
                                 "env.eval_size=4", "trainer.warmstart.enabled=false"), tmp_path)
    metrics = evaluate(run, "eval")
    for bot in ("random", "first_legal"):
        for seat in ("player_0", "player_1"):
            shares = [metrics[f"eval/vs_{bot}/{seat}/{k}"] for k in ("win", "draw", "loss")]
            assert sum(shares) == pytest.approx(1.0) and metrics[f"eval/vs_{bot}/{seat}/games"] == 4.0
        assert f"eval/vs_{bot}/player_0/games" in metrics
    # the untrained model's moves are illegal: against a bot moving first it loses every game it reaches
    assert metrics["eval/vs_random/player_1/loss"] == 1.0 and metrics["eval/vs_random/player_1/illegal_loss"] == 1.0


def test_a_mixture_trains_each_game_with_its_own_baselines_and_reports_each(tmp_path):
    summary = train(train_config(*GAME, "env.mixture=[kuhn_poker,tic_tac_toe]", "algorithm=rae", "trainer.steps=1",
                                 "rollout.tasks_per_step=4", "env.eval_size=4", "workflow.max_turns=5"), tmp_path)
    step = next(m for m in metric_records(tmp_path) if m.get("step") == 1 and "train/reward" in m)
    assert {k for k in step if k.startswith("train/rae/baseline/")} >= {
        "train/rae/baseline/0/player_0", "train/rae/baseline/1/player_0"}
    for game in ("kuhn_poker", "tic_tac_toe"):
        assert summary[f"eval/{game}/games"] == 2.0 and f"eval/{game}/player_1/win" in summary


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.game=kuhn_pokr"], "env.game=kuhn_pokr: no such OpenSpiel game; similar: kuhn_poker"),
    (["+env.params.foo=1"], "env.params={'foo': 1}: OpenSpiel's kuhn_poker refuses them"),
    (["env.game=leduc_poker", "+env.params.players=3"], "workflow.roles names 2 seats (player_0, player_1) but "
                                                         "leduc_poker is played by 3"),
    (["+policy.scripted.player_1=mcts"], "policy.scripted.player_1=mcts searches the true state; kuhn_poker hides"),
    (["env.game=connect_four", "+policy.scripted.player_1=minimax", "env.nash_conv=true"],
     "env.nash_conv=true enumerates every information state"),
    (["env.game=goofspiel"], "env.game=goofspiel is a simultaneous-move game"),
    (["env.eval_opponents=[mcts]"], "env.eval_opponents=mcts searches the true state; kuhn_poker hides"),
    (["env.mixture=[kuhn_poker,hearts]"], "env.mixture mixes games of different seat counts"),
    (["env.mixture=[kuhn_poker,tic_tac_tow]"], "env.mixture names tic_tac_tow: no such OpenSpiel game; similar: "
                                               "tic_tac_toe"),
    (["workflow=single_agent", "workflow.roles=[agent]"], "env=openspiel"),
    (["env=plan_path"], "workflow=game plays games; env=plan_path is not one"),
    (["env=textarena", "env.env_id=SimpleNegotation-v0"], "env.env_id=SimpleNegotation-v0: no such TextArena env; "
                                                          "similar: SimpleNegotiation-v0,"),
    (["env=textarena", "env.env_id=TicTacToe-v0-raw", "env.players=3", "workflow.roles=[a,b,c]"],
     "env.players=3: TextArena's TicTacToe-v0-raw refuses it"),
    (["env=textarena", "+policy.scripted.player_1=random"], "policy.scripted.player_1=random: TextArena games have no "
                                                             "bots"),
    (["env=textarena", "workflow=single_agent", "workflow.roles=[agent]"], "env=textarena is a game"),
])
def test_bad_game_setups_fail_in_one_line(overrides, message):
    assert message in refusal([*GAME, *overrides])
