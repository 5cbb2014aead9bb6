import pytest
import torch
from torch import nn

from marl_cli.algorithms.td import critic_targets, polyak_update, td_target

NAN = float("nan")


def t(*values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def test_td_target_with_a_terminal_step():
    # γ = 0.9: 1 + 0.9·2 = 2.8; terminal: 0.5 (its NaN next value ignored); 0 + 0.9·(−1) = −0.9
    close(td_target(t(1.0, 0.5, 0.0), t(2.0, NAN, -1.0), torch.tensor([0, 1, 0]), 0.9), t(2.8, 0.5, -0.9))
    close(td_target(t(1.0), t(2.0), torch.tensor([False]), 0.9), t(2.8))


def test_critic_targets_pair_each_head_with_its_own_target_head():
    rewards, dones = t(1.0, 0.0), torch.tensor([0.0, 1.0])
    next_v = (t(2.0, 5.0, grad=True), t(1.0, 7.0, grad=True))
    policy_q = (t(0.3, 0.6, grad=True), t(0.4, 0.2, grad=True))
    # Q1 ← 1 + 0.9·2 = 2.8, 0 (terminal);  Q2 ← 1 + 0.9·1 = 1.9, 0;  V_i ← Q̄_i(s, a_π)
    out = critic_targets(rewards, dones, next_v, policy_q, 0.9)
    close(out.q1, t(2.8, 0.0))
    close(out.q2, t(1.9, 0.0))
    close(out.v1, t(0.3, 0.6))
    close(out.v2, t(0.4, 0.2))
    assert not any(x.requires_grad for x in out)
    # clipped: min V̄ = (1, 5) → both Q ← (1.9, 0); min Q̄ = (0.3, 0.2) → both V ← (0.3, 0.2)
    clipped = critic_targets(rewards, dones, next_v, policy_q, 0.9, clipped=True)
    for x, expected in zip(clipped, [t(1.9, 0.0), t(1.9, 0.0), t(0.3, 0.2), t(0.3, 0.2)], strict=True):
        close(x, expected)


class Head(nn.Module):
    def __init__(self, w: float, b: float, scale: float, count: int):
        super().__init__()
        self.linear = nn.Linear(2, 1, dtype=torch.float64)
        nn.init.constant_(self.linear.weight, w)
        nn.init.constant_(self.linear.bias, b)
        self.register_buffer("scale", t(scale))
        self.register_buffer("count", torch.tensor([count]))


def state(m: Head):
    return m.linear.weight.tolist(), m.linear.bias.tolist(), m.scale.tolist(), m.count.tolist()


@pytest.mark.parametrize(("tau", "expected"), [
    (1.0, ([[3.0, 3.0]], [-2.0], [0.0], [0])),   # a copy (the integer buffer stays)
    (0.0, ([[1.0, 1.0]], [2.0], [4.0], [0])),    # kept
    # 0.75·1 + 0.25·3 = 1.5;  0.75·2 + 0.25·(−2) = 1;  0.75·4 + 0.25·0 = 3
    (0.25, ([[1.5, 1.5]], [1.0], [3.0], [0])),
])
def test_polyak_update(tau, expected):
    target, source = Head(1.0, 2.0, 4.0, 0), Head(3.0, -2.0, 0.0, 7)
    polyak_update(target, source, tau)
    assert state(target) == expected
    assert state(source) == ([[3.0, 3.0]], [-2.0], [0.0], [7])
    assert target.linear.weight.requires_grad and target.linear.weight.grad is None


def test_polyak_update_rejects_mismatched_modules_and_tau():
    with pytest.raises(ValueError, match="names or shapes differ"):
        polyak_update(nn.Linear(2, 1), nn.Linear(3, 1), 0.1)
    with pytest.raises(ValueError, match="names or shapes differ"):
        polyak_update(nn.Sequential(nn.Linear(2, 1)), nn.Linear(2, 1), 0.1)
    with pytest.raises(ValueError, match="tau"):
        polyak_update(nn.Linear(2, 1), nn.Linear(2, 1), 1.5)
