"""SPIRAL's RAE and MARS's turn-level advantages against values computed by hand, and RAE's baselines across a
resume."""

import random

import pytest
from omegaconf import OmegaConf

from marl_cli.algorithms.mars import MARSConfig, mars_estimator
from marl_cli.algorithms.rae import RAEConfig, rae_estimator
from marl_cli.core.samples import Sample
from tests.helpers import metric_records, refusal, train_config
from tests.workflows.test_game import GAME


def _row(task, turn, seat, outcome, legal=True, penalty=0.0):
    return Sample(task, 0, turn, f"player_{seat}", "shared", [1], [2], outcome + penalty, format_ok=legal,
                  info={"seat_return": outcome, "game": 0.0})


def _rae(**kw):
    return OmegaConf.structured(RAEConfig(**{"name": "rae", **kw}))


def _mars(**kw):
    return OmegaConf.structured(MARSConfig(**{"name": "mars", **kw}))


def test_rae_reads_each_seats_baseline_before_updating_it_game_by_game_and_step_by_step():
    memory = {}
    rows = [_row(0, 0, 0, 1.0), _row(0, 0, 1, -1.0), _row(0, 1, 0, 1.0), _row(1, 0, 0, -1.0), _row(1, 0, 1, 1.0)]
    _, stats = rae_estimator(rows, _rae(alpha=0.5, gamma=0.5), random.Random(0), memory=memory)
    # game 0: p0 1 - 0 = 1 (its earlier turn 0.5), p1 -1; b0 = 0.5, b1 = -0.5
    # game 1: p0 -1 - 0.5 = -1.5, b0 = 0.25 - 0.5 = -0.25; p1 1 + 0.5 = 1.5, b1 = -0.25 + 0.5 = 0.25
    assert [r.advantage for r in rows] == pytest.approx([0.5, -1.0, 1.0, -1.5, 1.5])
    assert memory == pytest.approx({"0/player_0": -0.25, "0/player_1": 0.25})
    assert stats["rae/baseline/0/player_0"] == pytest.approx(-0.25)
    again = [_row(0, 0, 0, 1.0), _row(0, 0, 1, 0.0)]
    rae_estimator(again, _rae(alpha=0.5), random.Random(0), memory=memory)
    assert [r.advantage for r in again] == pytest.approx([1.25, -0.25])  # the next step reads the carried baselines
    assert memory == pytest.approx({"0/player_0": 0.375, "0/player_1": 0.125})


def test_rae_drops_turns_with_no_advantage_and_adds_a_retried_moves_penalty():
    rows = [_row(0, 0, 0, 0.0), _row(0, 0, 1, 0.0, legal=False, penalty=-0.1), _row(0, 1, 1, 0.0)]
    rae_estimator(rows, _rae(), random.Random(0), memory={})
    assert [r.advantage for r in rows] == pytest.approx([0.0, -0.1, 0.0]) and [r.keep for r in rows] == \
        [False, True, False]
    rae_estimator(rows, _rae(filter_zero=False), random.Random(0), memory={})
    assert all(r.keep for r in rows)


def test_mars_turn_level_advantages_per_seat_by_hand():
    rows = [_row(0, 0, 0, 1.0), _row(0, 0, 1, -1.0), _row(0, 1, 0, 1.0)]
    mars_estimator(rows, _mars(), random.Random(0))
    # turn rewards p0 [0.05, 1.05], p1 [-0.95]; centred per seat [-0.5, 0.5], [0]; whitened (sd 0.5) [-1, 1], [0];
    # returns-to-go p0 [0, 1], p1 [0]; shifted per seat [-0.5, 0.5], [0]; whitened [-1, 1], [0]
    assert [rows[0].advantage, rows[2].advantage, rows[1].advantage] == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)


def test_mars_pooled_normalisation_by_hand():
    rows = [_row(0, 0, 0, 1.0), _row(0, 0, 1, -1.0), _row(0, 1, 0, 1.0)]
    mars_estimator(rows, _mars(agent_norm=False), random.Random(0))
    # turn rewards [0.05, 1.05 | -0.95] centred on 0.05: [0, 1 | -1] (sd 1); returns [1, 1 | -1]; shifted by 1/3:
    # [2/3, 2/3 | -4/3]; whitened (sd sqrt(4/3)): [0.57735, 0.57735 | -1.1547]
    assert [rows[0].advantage, rows[2].advantage, rows[1].advantage] == pytest.approx(
        [0.577350, 0.577350, -1.154701], abs=1e-5)


def test_rae_baselines_are_checkpointed_and_a_resume_restores_them_exactly(tmp_path):
    common = [*GAME, "algorithm=rae", "algorithm.alpha=0.5", "trainer.warmstart.enabled=true",
              "trainer.warmstart.num_examples=32", "trainer.save_every=1", "trainer.eval_every=0",
              "env.illegal=retry"]
    from marl_cli.training.loop import train

    train(train_config(*common, "trainer.steps=3"), tmp_path / "straight")
    train(train_config(*common, "trainer.steps=1"), tmp_path / "resumed")
    train(train_config(*common, "trainer.steps=3", f"trainer.resume={tmp_path / 'resumed'}"), tmp_path / "resumed")

    def baselines(run):
        return [{k: v for k, v in m.items() if k.startswith("train/rae/")} for m in metric_records(run) if "step" in m
                and any(k.startswith("train/rae/baseline") for k in m)]

    straight, resumed = baselines(tmp_path / "straight"), baselines(tmp_path / "resumed")
    assert len(straight) == 3 and straight == resumed[-3:]
    assert any(v != 0.0 for v in straight[-1].values())


@pytest.mark.parametrize("algorithm", ["rae", "mars"])
def test_the_game_estimators_refuse_a_workflow_that_is_not_a_game(algorithm):
    assert f"algorithm={algorithm} scores the seats of a game" in refusal(
        ["~experiment", f"algorithm={algorithm}", "env=plan_path", "workflow=single_agent"])
