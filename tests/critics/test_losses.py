"""The value loss and its diagnostics against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from marl_cli.critics.losses import explained_variance, value_clip_fraction, value_loss, value_terms
from tests.precision import rounding

F64 = torch.float64
VALUES = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=F64)
OLD = torch.tensor([0.9, 2.5, 0.5, 0.0], dtype=F64)
TARGETS = torch.tensor([1.5, 1.0, 0.0, 9.0], dtype=F64)
MASK = torch.tensor([1, 1, 1, 0])
CLOSE = rounding(10)


def test_the_clipped_value_loss_takes_the_larger_of_the_two_squared_errors():
    # entry 0: (1 − 1.5)² = 0.25; clipped: 0.9 + clip(0.1) = 1.0 → (1.0 − 1.5)² = 0.25
    # entry 1: (2 − 1)² = 1; clipped: 2.5 + clip(−0.5 → −0.2) = 2.3 → (2.3 − 1)² = 1.69, the larger
    # entry 2: (0.5 − 0)² = 0.25 both; entry 3 is masked out (its 36 would count otherwise)
    assert float(value_loss(VALUES, OLD, TARGETS, MASK, 0.2)) == pytest.approx(0.5 * (0.25 + 1.69 + 0.25) / 3,
                                                                                 rel=CLOSE)
    assert value_terms(VALUES, OLD, TARGETS, 0.2)[1].item() == pytest.approx(0.5 * 1.69, rel=CLOSE)
    # no clip: ½·mean((V − R)²) = ½·(0.25 + 1 + 0.25)/3, old values unread
    assert float(value_loss(VALUES, None, TARGETS, MASK, None)) == pytest.approx(0.25, rel=CLOSE)


def test_the_value_loss_of_no_entries_is_zero_and_masked_nans_do_not_leak():
    values = torch.tensor([1.0, float("nan")], dtype=F64, requires_grad=True)
    loss = value_loss(values, None, torch.tensor([3.0, 1.0], dtype=F64), torch.tensor([1, 0]), None)
    loss.backward()
    assert loss.item() == 2.0 and values.grad.tolist() == [-2.0, 0.0]
    assert float(value_loss(VALUES, OLD, TARGETS, torch.zeros(4), 0.2)) == 0.0
    with pytest.raises(ValueError, match="old values"):
        value_terms(VALUES, None, TARGETS, 0.2)


def test_explained_variance():
    # R − V = (−0.5, 0.5, 1): Var = 7/18; Var(R) of (1, 2, 3) = 2/3 = 12/18; EV = 1 − 7/12 (entry 3 masked)
    values = torch.tensor([1.5, 1.5, 2.0, 100.0], dtype=F64)
    targets = torch.tensor([1.0, 2.0, 3.0, -50.0], dtype=F64)
    assert explained_variance(values, targets, MASK) == pytest.approx(5 / 12, rel=CLOSE)
    assert explained_variance(targets, targets, MASK) == 1.0
    assert explained_variance(values, torch.full((4,), 2.0, dtype=F64), MASK) == 0.0  # Var(R) = 0
    assert explained_variance(values, targets, torch.zeros(4)) == 0.0


def test_the_clip_fraction_counts_the_values_that_moved_past_the_clip():
    # |V − V_old| = 0.1, 0.5, 0, (3: masked) → one of three past 0.2
    assert value_clip_fraction(VALUES, OLD, MASK, 0.2) == pytest.approx(1 / 3, rel=CLOSE)
    assert value_clip_fraction(VALUES, OLD, MASK, 1.0) == 0.0
    assert value_clip_fraction(VALUES, OLD, torch.zeros(4), 0.2) == 0.0
