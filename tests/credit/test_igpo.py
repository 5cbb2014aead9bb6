"""IGPO (``credit=igpo``): the teacher-forced probability of the correct answer on a tiny model against the
formula computed row by row, the turn rewards it gives (gains, the last turn's outcome), the discounted sums of the
normalised rewards, a whole run, and the settings it refuses."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides
from marl_cli.core.samples import Sample
from marl_cli.credit.igpo import IgpoConfig, igpo_advantages, igpo_rewards, information_gain, reference_probabilities
from marl_cli.training.build import build_run
from marl_cli.training.loop import train
from tests.helpers import FAST, train_config
from tests.precision import rounding, to_float64
from tests.training.learner.test_policy_trainer import TERMS


def _row(turn, reward, branch=0, prompt=(5, 6, 7), reference="#### R D"):
    return Sample(task=0, branch=branch, turn=turn, role="agent", policy="shared", prompt_ids=list(prompt),
                  completion_ids=[9], reward=reward, reference=reference)


def test_gains_pay_every_turn_but_the_last_which_keeps_its_outcome():
    rows = [_row(2, 1.0), _row(0, 0.5), _row(1, 0.2), _row(0, 0.7, branch=1)]  # branch 1 ended after one turn
    probability = {0: 0.3, 1: 0.1, 2: 0.4, 3: 0.9}
    credit = OmegaConf.structured(IgpoConfig(name="igpo", gain_weight=2.0))
    gains = information_gain(rows, probability, credit)
    assert sorted(gains) == pytest.approx(sorted([0.4 - 0.1, 0.3 - 0.4]), abs=1e-15)
    assert [r.reward for r in rows] == pytest.approx([1.0, 2 * 0.3, 2 * -0.1, 0.7], abs=1e-15)
    rows = [_row(0, 0.5), _row(1, 0.2)]
    information_gain(rows, {0: 0.1, 1: 0.4}, OmegaConf.structured(IgpoConfig(name="igpo", keep_turn_rewards=True)))
    assert [r.reward for r in rows] == pytest.approx([0.5 + 0.3, 0.2], abs=1e-15)


def test_each_turns_advantage_sums_the_normalised_ones_after_it():
    rows = [_row(0, 0.0), _row(1, 0.0), _row(2, 0.0), _row(0, 0.0, branch=1)]
    for r, a in zip(rows, [1.0, -2.0, 0.5, 3.0], strict=True):
        r.advantage = a
    igpo_advantages(rows, OmegaConf.structured(IgpoConfig(name="igpo", gamma=0.5)), None)
    assert [r.advantage for r in rows] == pytest.approx([1.0 - 1.0 + 0.125, -2.0 + 0.25, 0.5, 3.0], abs=1e-15)


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run whose policy computes in float64 (``tests/precision.py``): batched and row-by-row scoring differ only
    by summation order."""
    run = build_run(train_config(*FAST), tmp_path / "run")
    to_float64(run.policies["shared"], monkeypatch)
    return run


def _by_hand(policy, prompt, reference):
    """exp(mean_j log π(g_j | x, g_<j)) from one unpadded forward of prompt + answer."""
    answer = policy.tokenizer(reference, add_special_tokens=False).input_ids
    ids = torch.tensor([list(prompt) + answer])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0].double()
    logps = torch.log_softmax(logits, -1)
    start = len(prompt)
    return math.exp(sum(float(logps[start + j - 1, t]) for j, t in enumerate(answer)) / len(answer))


def test_the_probability_of_the_answer_is_the_teacher_forced_formula(run):
    """Batched with left-padded prompts (explicit positions) against one unpadded forward per row."""
    policy = run.policies["shared"]
    rows = [_row(0, 0.0, prompt=p, reference=g) for p, g in [((5, 6, 7), "#### R D"), ((8,), "#### U"),
                                                             ((5, 9, 9, 9, 4), "#### R R D D")]]
    got = reference_probabilities(policy, rows, batch_size=2)
    for row, p in zip(rows, got, strict=True):
        assert p == pytest.approx(_by_hand(policy, row.prompt_ids, row.reference), rel=rounding(TERMS))


def test_the_reward_hook_scores_each_distinct_prompt_once_and_counts_rows_without_an_answer(run):
    credit = OmegaConf.structured(IgpoConfig(name="igpo"))
    rows = [_row(0, 0.0), _row(1, 1.0, prompt=(5, 6, 7, 8)), _row(0, 0.0, branch=1),
            _row(1, 0.0, branch=1, reference=None), _row(0, 0.0, branch=2, reference="")]
    stats = igpo_rewards(rows, credit, run)
    policy = run.policies["shared"]
    p0, p1 = _by_hand(policy, (5, 6, 7), "#### R D"), _by_hand(policy, (5, 6, 7, 8), "#### R D")
    assert rows[0].reward == pytest.approx(p1 - p0, abs=rounding(TERMS))
    assert rows[1].reward == 1.0 and rows[2].reward == 0.0  # the last turn's outcome; no next turn was scored
    assert stats["igpo_scored"] == 3 and stats["igpo_unscored"] == 2  # no answer, or an empty one


def test_igpo_refuses_per_turn_groups_in_one_line():
    with pytest.raises(ConfigError) as err:
        check_overrides("train", ["credit=igpo"])
    assert "set algorithm.norm_group=episode" in str(err.value) and "\n" not in str(err.value)
    check_overrides("train", ["credit=igpo", "algorithm.norm_group=episode"])


def test_a_multi_turn_run_trains_on_information_gain(tmp_path):
    run = tmp_path / "r"
    summary = train(train_config(*FAST, "credit=igpo", "algorithm.norm_group=episode", "workflow.max_turns=2",
                                 "trainer.steps=1"), run)
    assert summary["status"] == "completed"
    step = next(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                if '"train/reward"' in line)
    assert step["credit/igpo_scored"] > 0 and step["time/credit_s"] > 0
    assert 0.0 < step["credit/igpo_probability_mean"] < 1.0 and "train/shared/loss" in step
