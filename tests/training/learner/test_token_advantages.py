"""Per-token advantages (``Sample.token_advantages``) reach TRL's loss unchanged: the collated (B, T) tensor, the
loss and its gradient against the formula by hand, a constant per-token row equal to its scalar row, and the rows
with a gradient."""

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.policies.regime import build_policies
from marl_cli.training.learner.policy_trainer import collate, with_gradient
from marl_cli.training.learner.trl_adapter import GRPOAdapter, grpo_args
from tests.policies.test_tiny import SMALL
from tests.precision import assert_rounding_close, rounding, to_float64
from tests.training.learner.test_policy_trainer import TERMS

COMPLETIONS = [[20, 21, 22, 1], [23, 24], [25, 26, 27]]
TOKEN_ADVANTAGES = [[1.0, 0.5, -0.25, 2.0], [], [-1.0, 0.0, 3.0]]
SCALARS = [0.7, -1.5, 0.2]


@pytest.fixture
def policy(tmp_path):
    model_cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return build_policies({"agent": "shared"}, model_cfg, 0, tmp_path, torch.device("cpu"))["shared"]


@pytest.fixture
def policy64(policy, monkeypatch):
    """The policy computing in float64 (``tests/precision.py``)."""
    return to_float64(policy, monkeypatch)


def _rows(token_advantages=TOKEN_ADVANTAGES):
    return [Sample(task=0, branch=i, turn=0, role="agent", policy="shared", prompt_ids=[10, 11, 12][: 1 + i],
                   completion_ids=c, reward=0.0, advantage=a, token_advantages=list(t))
            for i, (c, a, t) in enumerate(zip(COMPLETIONS, SCALARS, token_advantages, strict=True))]


def _adapter(policy, tmp_path):
    cfg = OmegaConf.structured(TrainerConfig(learning_rate=1e-2, steps=10))
    args = grpo_args(cfg, 1.0, 8, tmp_path / "trl", 0, policy.model.device, policy.autocast_dtype)
    return GRPOAdapter(policy.model, policy.tokenizer, args, cfg, World())


def test_collate_gives_one_advantage_per_token_and_spreads_a_scalar_row(policy):
    batch = collate(_rows(), policy.tokenizer.pad_token_id, torch.device("cpu"))
    assert batch["advantages"].tolist() == [[1.0, 0.5, -0.25, 2.0], [-1.5, -1.5, 0.0, 0.0], [-1.0, 0.0, 3.0, 0.0]]
    scalar = collate(_rows([[], [], []]), policy.tokenizer.pad_token_id, torch.device("cpu"))
    assert scalar["advantages"].shape == (3,)


def test_a_row_of_the_wrong_length_is_refused(policy):
    rows = _rows([[1.0], [], []])
    with pytest.raises(ValueError, match="1 token advantages for 4 completion tokens"):
        collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu"))


def test_trls_loss_and_gradient_are_the_per_token_formula(policy64, tmp_path):
    """At the sampling weights (ratio 1) TRL's grpo loss is −mean_i(Σ_t A_it·m_it / Σ_t m_it) and its gradient
    −mean_i(Σ_t A_it·∇log π_it / T_i); in float64 the two computations differ only by summation order."""
    policy = policy64
    adapter = _adapter(policy, tmp_path)
    batch = collate(_rows(), policy.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        batch["old_per_token_logps"] = adapter.logps(policy.model, batch)[0]
    policy.model.train()
    params = [p for p in policy.model.parameters() if p.requires_grad]
    loss = adapter.loss(policy.model, batch)
    trl_grads = torch.autograd.grad(loss, params, allow_unused=True)
    logps = adapter.logps(policy.model, batch)[0]
    mask = batch["completion_mask"].float()
    ratio = torch.exp(logps - logps.detach())
    hand = -((batch["advantages"] * ratio * mask).sum(1) / mask.sum(1)).mean()
    hand_grads = torch.autograd.grad(hand, params, allow_unused=True)
    expected = -sum(sum(t or [a] * len(c)) / len(c) for c, a, t in zip(COMPLETIONS, SCALARS, TOKEN_ADVANTAGES,
                                                                      strict=True)) / 3
    assert float(loss.detach()) == pytest.approx(expected, rel=rounding(TERMS))
    assert float(hand.detach()) == pytest.approx(expected, rel=rounding(TERMS))
    for ours, theirs in zip(hand_grads, trl_grads, strict=True):
        if ours is not None:
            assert_rounding_close(theirs, ours, TERMS)


def test_a_constant_per_token_row_trains_as_its_scalar_row(policy, tmp_path):
    adapter = _adapter(policy, tmp_path)
    scalar = collate(_rows([[], [], []]), policy.tokenizer.pad_token_id, torch.device("cpu"))
    spread = collate(_rows([[a] * len(c) for c, a in zip(COMPLETIONS, SCALARS, strict=True)]),
                     policy.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        old = adapter.logps(policy.model, scalar)[0]
    scalar["old_per_token_logps"] = spread["old_per_token_logps"] = old
    policy.model.eval()
    assert torch.equal(adapter.loss(policy.model, scalar), adapter.loss(policy.model, spread))


def test_a_row_with_credit_on_some_token_has_a_gradient():
    rows = _rows([[0.0, 0.0, 0.0, 0.5], [], [0.0, 0.0, 0.0]])
    rows[0].advantage = rows[2].advantage = 0.0
    assert with_gradient(rows, beta=0.0) == [0, 1]
    assert with_gradient(rows, beta=0.1) == [0, 1, 2]
