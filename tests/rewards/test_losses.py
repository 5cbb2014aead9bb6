"""The learned reward models' losses and SPA's step rewards, against hand-computed values (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from marl_cli.rewards.losses import bradley_terry_loss, progress_loss, progress_rewards, regression_loss


def test_bradley_terry_loss_and_its_gradient_by_hand():
    chosen = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([0.0, 0.0], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(chosen, rejected)
    # pair 1: Δ = 1, −log σ(1) = log(1 + e^−1); pair 2: Δ = 0, log 2
    assert float(loss) == pytest.approx((math.log(1 + math.exp(-1)) + math.log(2)) / 2, abs=1e-15)
    loss.backward()
    # ∂L/∂r⁺_i = −σ(−Δ_i)/N: σ(−1)/2 = 1/(2(1+e)), σ(0)/2 = 1/4
    expected = torch.tensor([-1 / (2 * (1 + math.e)), -0.25], dtype=torch.float64)
    assert torch.allclose(chosen.grad, expected, atol=1e-15, rtol=0)
    assert torch.allclose(rejected.grad, -expected, atol=1e-15, rtol=0)


def test_bradley_terry_prefers_the_chosen_by_a_wide_margin_at_no_cost():
    loss = bradley_terry_loss(torch.tensor([40.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64))
    assert 0 <= float(loss) < 1e-15


@pytest.mark.parametrize(("chosen", "rejected"), [([1.0], [0.0, 1.0]), ([], [])])
def test_bradley_terry_needs_paired_scores(chosen, rejected):
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        bradley_terry_loss(torch.tensor(chosen), torch.tensor(rejected))


def test_regression_loss_by_hand():
    scores = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert float(regression_loss(scores, torch.tensor([1.0, 0.0]))) == pytest.approx((0.25 + 4.0) / 2, abs=1e-15)


def test_progress_loss_compares_each_episodes_sum_with_its_outcome():
    c = [torch.tensor([0.2, 0.3, 0.1], dtype=torch.float64, requires_grad=True),
         torch.tensor([0.5], dtype=torch.float64, requires_grad=True)]
    loss = progress_loss(c, torch.tensor([1.0, 0.0]))
    # episode 1: (0.6 − 1)² = 0.16; episode 2: (0.5 − 0)² = 0.25
    assert float(loss) == pytest.approx((0.16 + 0.25) / 2, abs=1e-15)
    loss.backward()
    # ∂L/∂c_t = 2(Σc − R)/E for every step of the episode: 2·(−0.4)/2, 2·0.5/2
    assert torch.allclose(c[0].grad, torch.full((3,), -0.4, dtype=torch.float64), atol=1e-15, rtol=0)
    assert torch.allclose(c[1].grad, torch.tensor([0.5], dtype=torch.float64), atol=1e-15, rtol=0)


def test_progress_loss_needs_one_outcome_per_episode():
    with pytest.raises(ValueError, match="2 episodes of contributions for 1 outcomes"):
        progress_loss([torch.zeros(1), torch.zeros(2)], torch.tensor([1.0]))


def test_spa_step_rewards_pay_contribution_and_validity():
    assert progress_rewards([0.25, -0.5, 1.0], [True, False, True], 1.0, 0.5) == [0.75, -0.5, 1.5]
    assert progress_rewards([0.2], [True], 2.0, 0.0) == [0.4]
