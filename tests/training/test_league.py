"""The league: Bradley–Terry ratings against values computed by hand, and a round-robin of saved runs and bots from
``marl eval``."""

import json
import math

import pytest

from marl_cli.training.evaluation import run_evaluation
from marl_cli.training.league import bradley_terry, player_name
from marl_cli.training.loop import train
from tests.helpers import refusal, train_config
from tests.workflows.test_game import GAME


def test_two_players_ratings_follow_their_points_with_one_draw_added():
    # 3 wins of 4 (+ one draw: 3.5 of 5): p0/p1 = 3.5/1.5 -> 400·log10(7/3) apart, centred on 1000
    ratings = bradley_terry([[0.0, 3.0], [1.0, 0.0]])
    gap = 400 * math.log10(3.5 / 1.5)
    assert ratings == pytest.approx([1000 + gap / 2, 1000 - gap / 2], abs=1e-6)


def test_three_players_ratings_solve_the_likelihood_equations():
    points = [[0.0, 3.0, 4.0], [1.0, 0.0, 2.5], [0.0, 1.5, 0.0]]
    ratings = bradley_terry(points)
    p = [10 ** ((r - 1000) / 400) for r in ratings]
    won = [[points[i][j] + (0.5 if i != j else 0.0) for j in range(3)] for i in range(3)]
    for i in range(3):  # the MLE: each player's points equal its expected points
        expected = sum((won[i][j] + won[j][i]) * p[i] / (p[i] + p[j]) for j in range(3) if j != i)
        assert sum(won[i]) == pytest.approx(expected, rel=1e-9)
    assert ratings[0] > ratings[1] > ratings[2] and sum(math.log10(x) for x in p) == pytest.approx(0.0, abs=1e-9)


def test_player_names():
    assert player_name("bot:mcts") == "mcts"
    assert player_name("/x/runs/kuhn/checkpoints/step_000040") == "kuhn@step_000040"
    assert player_name("/x/runs/kuhn") == "kuhn"


def test_marl_eval_rates_a_saved_run_against_bots_in_a_round_robin(tmp_path):
    train(train_config(*GAME, "env.game=tic_tac_toe", "trainer.steps=1", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=32", "env.eval_size=2"), tmp_path / "run")
    from hydra import compose, initialize_config_dir

    from marl_cli.config.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("eval", [*GAME, "env.game=tic_tac_toe", "env.eval_size=3",
                               f"eval.league=[{tmp_path / 'run'},bot:random,bot:first_legal]"])
    summary = run_evaluation(cfg, tmp_path / "league")
    names = ["run", "random", "first_legal"]
    assert summary["status"] == "completed"
    ratings = [summary[f"eval/league/{n}/rating"] for n in names]
    assert sum(ratings) / 3 == pytest.approx(1000.0, abs=1e-6)
    assert all(0.0 <= summary[f"eval/league/{n}/score"] <= 1.0 for n in names)
    assert json.loads((tmp_path / "league" / "summary.json").read_text())["league"][1] == "bot:random"


@pytest.mark.parametrize(("overrides", "message"), [
    (["+eval.league=[bot:random]"], "eval.league needs two players or more"),
    (["+eval.league=[bot:random,/no/such/run]"], "eval.league names /no/such/run: no such run or checkpoint"),
    (["+eval.league=[bot:random,bot:mcts]"], "eval.league=mcts searches the true state"),
])
def test_a_league_it_cannot_play_is_refused(overrides, message):
    assert message in refusal([*GAME, *overrides])
