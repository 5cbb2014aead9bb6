"""The value model: its output, its head's seeded initialisation, and its trunk copied from a policy's model or
built fresh from a model config."""

from __future__ import annotations

import types
from pathlib import Path

import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig
from marl_cli.critics.value_model import HEAD_SCALE, ValueModel, build_value_model
from marl_cli.policies.tiny import build_tiny_model, build_tiny_tokenizer
from tests.policies.test_tiny import SMALL
from tests.precision import FLOAT32_ISLANDS

CPU = torch.device("cpu")
VOCAB = len(build_tiny_tokenizer())


def tiny_policy_model(seed: int = 0) -> torch.nn.Module:
    """A tiny Qwen3 causal LM (SMALL) standing for a policy's model."""
    return build_tiny_model(SMALL, VOCAB, seed)


def float64_value_model(heads: int, seed: int = 0, tmp: Path | None = None) -> ValueModel:
    """A value model on a copy of ``tiny_policy_model``'s trunk computing in float64: the rotary tables and RMS
    norms transformers computes in float32 whatever the dtype included (``tests/precision.py``)."""
    model = build_value_model(tiny_policy_model(), None, heads, seed, tmp or Path("."), CPU).double()
    for module in model.modules():
        for suffix, forward in FLOAT32_ISLANDS.items():
            if type(module).__name__.endswith(suffix):
                module.forward = types.MethodType(forward, module)
    return model


def test_forward_gives_every_position_a_value_per_head(tmp_path):
    model = build_value_model(tiny_policy_model(), None, 3, 0, tmp_path, CPU)
    ids = torch.tensor([[0, 0, 5, 6, 7], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    values = model(ids, mask)
    assert values.shape == (2, 5, 3) and values.dtype == torch.float32
    assert model.heads == 3 and torch.isfinite(values).all()


def test_head_init_is_deterministic_per_seed_and_leaves_the_global_rng_alone(tmp_path):
    def head(seed: int, global_seed: int) -> torch.nn.Linear:
        trunk = tiny_policy_model().model
        torch.manual_seed(global_seed)
        state = torch.get_rng_state()
        model = ValueModel(trunk, 4, seed)
        assert torch.equal(torch.get_rng_state(), state)  # the build draws nothing from the global generator
        return model.head

    a, b, c = head(7, 1), head(7, 2), head(8, 1)
    assert torch.equal(a.weight, b.weight) and not torch.equal(a.weight, c.weight)
    assert torch.equal(a.bias, torch.zeros(4))
    expected = HEAD_SCALE / SMALL.hidden_size ** 0.5
    # 128 draws of N(0, expected²), a fixed seed: their std is within 6% of it (one sd), here within 30%
    assert 0.7 * expected < float(a.weight.detach().std()) < 1.3 * expected


def test_a_copied_trunk_holds_the_policy_weights_without_the_lm_head(tmp_path):
    policy = tiny_policy_model(seed=3)
    model = build_value_model(policy, None, 1, 0, tmp_path, CPU)
    trunk, source = model.trunk.state_dict(), policy.model.state_dict()
    assert trunk.keys() == source.keys()
    assert all(torch.equal(trunk[k], source[k]) for k in source)
    assert not any("lm_head" in k for k in model.state_dict())
    with torch.no_grad():  # a copy: training the critic leaves the policy as it was
        model.trunk.embed_tokens.weight.add_(1.0)
    assert not torch.equal(policy.model.embed_tokens.weight, model.trunk.embed_tokens.weight)
    assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())


def test_a_fresh_value_model_builds_the_configured_tiny_model_in_fp32(tmp_path):
    cfg = OmegaConf.structured(ModelConfig(tiny=SMALL, dtype="bfloat16"))
    model = build_value_model(None, cfg, 2, 5, tmp_path, CPU)
    assert (tmp_path / "tiny_init_critic" / "config.json").exists()
    expected = tiny_policy_model(seed=5).model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.trunk.state_dict().items())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_rows_sharing_a_prompt_run_it_once_with_the_same_values_and_gradients():
    from marl_cli.core.padding import pad_rows
    from tests.precision import assert_rounding_close

    gen = torch.Generator().manual_seed(3)
    shared, other = [7, 8, 9, 10], [11, 12]
    rows = [(shared, [20, 21, 22]), (shared, [23]), (other, [24, 25]), (shared, [26, 27, 28, 29]), (other, [30])]
    prompts, prompt_mask = pad_rows([p for p, _ in rows], 0, left=True)
    completions, completion_mask = pad_rows([c for _, c in rows], 0, left=False)
    ids, mask = torch.cat([prompts, completions], 1), torch.cat([prompt_mask, completion_mask], 1)
    width = prompts.size(1)
    weights = torch.randn(len(rows), ids.size(1) - width + 1, 2, generator=gen, dtype=torch.float64)
    real = mask[:, width - 1:].bool().unsqueeze(-1)  # the last prompt token (always real) and the completions

    def values_and_grads(prompt_width: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model = float64_value_model(heads=2)
        model.trunk.embed_tokens.register_forward_hook(lambda m, args, out: passes.append(tuple(args[0].shape)))
        values = model(ids, mask, prompt_width=prompt_width)
        values = values if prompt_width else values[:, width - 1:]
        (values * weights * real).sum().backward()
        return (values * real).detach(), [p.grad for p in model.parameters()]

    passes: list[tuple[int, int]] = []
    (plain, plain_grads), (once, once_grads) = values_and_grads(0), values_and_grads(width)
    assert passes == [(5, ids.size(1)), (2, width - 1), (5, ids.size(1) - width + 1)]  # 2 distinct prompts, once
    assert once.shape == (5, ids.size(1) - width + 1, 2)
    assert_rounding_close(once, plain, 100)
    for a, b in zip(once_grads, plain_grads, strict=True):
        assert_rounding_close(a, b, 100)
