"""EPO's entropy terms (``losses/epo.py``): the corridor penalty, the smoothing schedule and the trajectory mean
against hand-computed values; the update adds −λ·[L_H − β_k·L_smooth] to TRL's loss, its penalty has a gradient, the
history is the steps' token-mean entropies and survives a checkpoint."""

import copy
import math
import random

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.losses.epo import EPO, EPOConfig, corridor_penalty, smoothing_weight, trajectory_mean, trajectory_weights
from marl_cli.training.learner.policy_trainer import PolicyTrainer, collate
from tests.precision import assert_rounding_close, to_float64
from tests.training.learner.test_loss_knobs import _policy
from tests.training.learner.test_policy_trainer import TERMS


def _cfg(**kw):
    return OmegaConf.structured(EPOConfig(**{"name": "epo", "coef": 0.1, "penalty": 0.5, **kw}))


def test_the_corridor_penalty_is_the_distance_outside_the_band_and_its_gradient_points_back():
    entropies = torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5], requires_grad=True)
    penalty = corridor_penalty(entropies, reference=1.0, low=0.8, high=1.2)
    torch.testing.assert_close(penalty, torch.tensor([0.3, 0.0, 0.0, 0.0, 0.3]))
    penalty.sum().backward()
    torch.testing.assert_close(entropies.grad, torch.tensor([-1.0, 0.0, 0.0, 0.0, 1.0]))
    assert corridor_penalty(torch.tensor([0.0, 1.3]), 1.0, 0.0, 1.2).tolist() == pytest.approx([0.0, 0.1])


def test_the_smoothing_weight_falls_from_two_over_the_run():
    assert smoothing_weight(0, 10, 3.0) == 2.0
    assert smoothing_weight(5, 10, 3.0) == pytest.approx(1 + math.exp(-3))
    assert smoothing_weight(10, 10, 3.0) == pytest.approx(1 + math.exp(-6))
    assert smoothing_weight(4, 1, 0.5) == pytest.approx(1 + math.exp(-2))  # k_mid is at least 1
    assert smoothing_weight(7, 10, 0.0) == 2.0


def _row(task, branch, turn, role="agent"):
    return Sample(task=task, branch=branch, turn=turn, role=role, policy="shared", prompt_ids=[3], completion_ids=[4],
                  reward=0.0)


def test_trajectory_weights_average_turns_then_trajectories():
    # trajectories: (0, 0, agent) with turns 1 and 0, (0, 1, agent), (0, 0, other); (1, 0, agent) has no counted row
    rows = [_row(0, 0, 1), _row(0, 1, 0), _row(0, 0, 0), _row(1, 0, 0), _row(0, 0, 0, "other")]
    counted = [True, True, True, False, True]
    assert trajectory_weights(rows, counted) == pytest.approx([1 / 6, 1 / 3, 1 / 6, 0.0, 1 / 3])
    assert trajectory_weights(rows, counted, processes=2) == pytest.approx([1 / 3, 2 / 3, 1 / 3, 0.0, 2 / 3])


def test_the_trajectory_mean_takes_each_rows_token_mean():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0], [2.0, 2.0, 5.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    weights = torch.tensor([0.25, 0.25, 0.5, 0.0])
    # 0.25·1.5 + 0.25·4 + 0.5·3 + 0 (a row without tokens)
    assert float(trajectory_mean(values, mask, weights)) == pytest.approx(2.875)


def test_epos_term_on_a_hand_computed_batch():
    entropies = torch.tensor([[1.0, 1.5, 2.0], [0.6, 9.9, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    weights = torch.tensor([0.5, 0.5])
    epo = EPO(_cfg(), steps=10)
    batch = {"epo_weights": weights}
    term, stats = epo(batch, entropies, mask, step=5)
    # no history: L_smooth = 0; L_H = 0.5·1.5 + 0.5·0.6 = 1.05
    assert float(term) == pytest.approx(-0.1 * 1.05) and stats == {"epo/entropy": pytest.approx(1.05)}
    epo.history = [1.0, 2.0]  # H̄ = 1.5, corridor [1.2, 1.8]: penalties 0.2, 0, 0.2 | 0.6 (the 9.9s are padding)
    term, stats = epo(batch, entropies, mask, step=5)
    smooth = 0.5 * (0.5 * 0.4 / 3 + 0.5 * 0.6)  # α × the trajectory mean of the penalties = 11/60
    assert smooth == pytest.approx(11 / 60)
    assert float(term) == pytest.approx(-0.1 * (1.05 - (1 + math.exp(-3)) * 11 / 60))
    assert stats["epo/reference"] == 1.5 and stats["epo/outside_fraction"] == 0.75
    assert stats["epo/smooth"] == pytest.approx(11 / 60) and stats["epo/beta"] == pytest.approx(1 + math.exp(-3))
    assert EPO(_cfg(window=1, coef=0.1), steps=10).reference() is None
    windowed = EPO(_cfg(window=1), steps=10)
    windowed.history = [1.0, 2.0]
    assert windowed.reference() == 2.0


def _episode_rows(advantages=(0.7, -0.4, 0.9, -1.0, 0.3)):
    """Two trajectories: task 0 with turns 0, 1, 2 and task 1 with turns 0, 1."""
    keys = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    gen = random.Random(7)
    return [Sample(task=task, branch=0, turn=turn, role="agent", policy="shared",
                   prompt_ids=[gen.randrange(3, 60) for _ in range(2 + i)],
                   completion_ids=[gen.randrange(3, 60) for _ in range(1 + (3 * i) % 5)], reward=0.0, advantage=a)
            for i, ((task, turn), a) in enumerate(zip(keys, advantages, strict=True))]


def _trainer(policy, tmp_path, **epo):
    """A learner of ``policy`` with EPO's settings ``epo`` (none: no loss term)."""
    cfg = OmegaConf.structured(TrainerConfig(learning_rate=1e-2, steps=10, mini_batch_size=64))
    loss = OmegaConf.structured(EPOConfig(name="epo", **epo)) if epo else None
    return PolicyTrainer(policy, cfg, temperature=0.7, max_completion_length=8, output_dir=tmp_path / "trl", seed=0,
                         loss=loss)


def test_an_update_adds_epos_term_to_trls_loss(tmp_path, monkeypatch):
    """One mini-batch: the update's loss is TRL's plus −λ·[L_H − β_k·α·L_smooth] of the policy's entropies before
    the step (hand-weighted: 1/6 for each of task 0's three turns, 1/4 for each of task 1's two); the step's
    token-mean entropy joins the history. In float64 (``tests/precision.py``)."""
    rows = _episode_rows()
    plain = _trainer(to_float64(_policy(tmp_path / "a"), monkeypatch), tmp_path / "a")
    batch = collate(rows, plain.policy.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        entropies = plain.grpo.logps(plain.learner, dict(batch, temperature=0.7), entropy=True)[1]
    mask = batch["completion_mask"].to(entropies.dtype)
    # H̄ the median token entropy, the corridor its quartiles: half the tokens inside, half outside
    low, reference, high = torch.quantile(entropies[mask.bool()], torch.tensor([0.25, 0.5, 0.75],
                                                                               dtype=entropies.dtype)).tolist()
    epo = _trainer(to_float64(_policy(tmp_path / "b"), monkeypatch), tmp_path / "b", coef=0.1, penalty=0.5,
                   corridor_low=low / reference, corridor_high=high / reference)
    epo.term.history = [reference]
    per_row = (entropies * mask).sum(1) / mask.sum(1)
    weights = torch.tensor([1 / 6, 1 / 6, 1 / 6, 1 / 4, 1 / 4], dtype=entropies.dtype)
    penalty = torch.relu(low - entropies) + torch.relu(entropies - high)
    bonus, smooth = (per_row * weights).sum(), 0.5 * ((penalty * mask).sum(1) / mask.sum(1) * weights).sum()
    beta = 1 + math.exp(-3.0 * 3 / 5)
    expected = -0.1 * (bonus - beta * smooth)
    assert 0 < float(((penalty > 0) * mask).sum()) < float(mask.sum())
    plain_stats, epo_stats = plain.update(rows, random.Random(0), 3), epo.update(rows, random.Random(0), 3)
    assert_rounding_close(torch.tensor(epo_stats["loss"] - plain_stats["loss"], dtype=torch.float64), expected, TERMS)
    assert epo_stats["epo/beta"] == pytest.approx(beta)
    assert_rounding_close(torch.tensor(epo_stats["epo/entropy"], dtype=torch.float64), bonus, TERMS)
    assert_rounding_close(torch.tensor(epo.term.history, dtype=torch.float64),
                          torch.stack([torch.tensor(reference, dtype=torch.float64), (entropies * mask).sum() /
                                       mask.sum()]), TERMS)


def test_the_entropy_terms_train_rows_without_an_advantage(tmp_path):
    """With every advantage 0 and β = 0 the GRPO loss has no gradient; EPO's terms still move the weights, on every
    row (none is skipped)."""
    rows = _episode_rows(advantages=(0.0,) * 5)
    for coef, moves in ((0.0, False), (0.5, True)):
        policy = _policy(tmp_path / str(coef))
        before = copy.deepcopy(policy.model.state_dict())
        stats = _trainer(policy, tmp_path / str(coef), coef=coef).update(rows, random.Random(0))
        after = policy.model.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before) == moves
        assert stats["trained_row_fraction"] == (1.0 if moves else 0.0)


def test_the_history_is_saved_and_restored(tmp_path):
    t = _trainer(_policy(tmp_path / "a"), tmp_path / "a", coef=0.1)
    for step in range(2):
        t.update(_episode_rows(), random.Random(step), step)
    state = t.state_dict()
    assert len(state["loss"]["epo"]["history"]) == 2
    fresh = _trainer(_policy(tmp_path / "b"), tmp_path / "b", coef=0.1)
    fresh.load_state_dict(state)
    assert fresh.term.history == t.term.history
    older = _trainer(_policy(tmp_path / "c"), tmp_path / "c", coef=0.1)
    older.load_state_dict({k: v for k, v in state.items() if k != "loss"})  # saved before EPO existed
    assert older.term.history == []
    assert "epo" not in _trainer(_policy(tmp_path / "d"), tmp_path / "d").state_dict()["loss"]
