"""The in-place growing key/value cache: the same keys and values as transformers' own, and the same samples."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers.cache_utils import DynamicLayer

from marl_cli.config.schema import ModelConfig
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.generation import HFGenerator, Sampling, takes_cache
from marl_cli.rollout.growing_cache import GrowingLayer, grow_in_place
from tests.policies.test_tiny import SMALL


def _kv(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=g), torch.randn(batch, 2, length, 4, generator=g)


def test_growing_layer_holds_what_the_dynamic_layer_holds():
    plain, growing = DynamicLayer(), DynamicLayer()
    grow_in_place(type("Cache", (), {"layers": [growing]}))
    assert type(growing) is GrowingLayer
    steps = [(3, 5), (3, 1), (3, 1), (3, 1), (3, 1), (3, 1), (3, 1), (3, 2)]
    for i, (batch, length) in enumerate(steps):
        for layer in (plain, growing):
            keys, values = layer.update(*_kv(batch, length, i))
        assert torch.equal(keys, plain.keys) and torch.equal(values, plain.values)
        assert torch.equal(growing.keys, plain.keys) and torch.equal(growing.values, plain.values)
    first = growing.buffers[0].data_ptr()
    assert growing.buffers[0].shape[-2] >= growing.get_seq_length() == 13  # 5 → 10 → 20 positions: grown twice
    growing.update(*_kv(3, 1, 99))
    plain.update(*_kv(3, 1, 99))
    assert growing.buffers[0].data_ptr() == first  # room left: written in place, no copy
    for layer in (plain, growing):  # what rebinds the keys (a batch selection) or cuts them (crop) still holds
        layer.batch_select_indices(torch.tensor([2, 0, 0, 1]))
        layer.update(*_kv(4, 3, 7))
        layer.crop(-2)
        layer.update(*_kv(4, 1, 8))
    assert torch.equal(growing.keys, plain.keys) and torch.equal(growing.values, plain.values)
    assert growing.get_seq_length() == plain.get_seq_length() == 16


def test_a_layer_grows_no_further_than_its_limit():
    plain, layer = DynamicLayer(), DynamicLayer()
    grow_in_place(type("Cache", (), {"layers": [layer]}), limit=12)
    for i, length in enumerate([8, 1]):
        plain.update(*_kv(2, length, i))
        layer.update(*_kv(2, length, i))
    assert layer.buffers[0].shape[-2] == 12  # 8 would double to 16: the limit holds it at 12
    first = layer.buffers[0].data_ptr()
    for i in range(2, 6):  # up to the limit in place, then one past it (grown to what it needs) still holds
        plain.update(*_kv(2, 1, i))
        layer.update(*_kv(2, 1, i))
        assert (layer.buffers[0].data_ptr() == first) == (i < 5)
    assert torch.equal(layer.keys, plain.keys) and torch.equal(layer.values, plain.values)
    assert layer.get_seq_length() == 13


def test_sliding_and_other_layers_are_left_alone():
    class Sliding(DynamicLayer):
        pass

    cache = type("Cache", (), {"layers": [Sliding(), DynamicLayer()]})
    grow_in_place(cache)
    assert [type(layer) for layer in cache.layers] == [Sliding, GrowingLayer]


@pytest.mark.parametrize("per_prompt", [1, 3])
def test_generation_samples_the_same_with_the_growing_cache(tmp_path, monkeypatch, per_prompt):
    """Long completions (past the buffers' doubling) from distinct and shared prompts: the same tokens and
    log-probs as decoding into transformers' concatenating cache."""
    cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    policy = build_policies({"agent": "shared"}, cfg, 0, tmp_path, torch.device("cpu"))["shared"]
    prompts = [f"Go from S to G on grid {'x' * 3 * i}{i}. Answer after ####." for i in range(4)]
    prompts = [p for p in prompts for _ in range(per_prompt)]
    sampling = Sampling(1.0, max_new_tokens=120, use_chat_template=False)
    runs = []
    for grow in (True, False):
        if not grow:
            monkeypatch.setattr("marl_cli.rollout.generation.grow_in_place", lambda cache, limit=None: cache)
        torch.manual_seed(0)
        runs.append(HFGenerator().generate(policy, prompts, sampling))
    grown, plain = runs
    assert max(len(g.completion_ids) for g in grown) > 2 * len(grown[0].prompt_ids)  # the buffers grew
    assert [g.completion_ids for g in grown] == [g.completion_ids for g in plain]
    for one, other in zip(grown, plain, strict=True):  # the same keys in the same order: the same float order
        assert one.logprobs == other.logprobs


def test_a_model_that_names_its_own_cache_generates_with_it(tmp_path):
    """transformers refuses a cache made outside ``generate`` when the generation config names one (static,
    offloaded): such a model samples through its own cache, the same greedy tokens."""
    cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    policy = build_policies({"agent": "shared"}, cfg, 0, tmp_path, torch.device("cpu"))["shared"]
    prompts = ["Go from S to G on grid 1. Answer after ####.", "Go from S to G on grid 2 x. Answer after ####."] * 2
    sampling = Sampling(0.0, max_new_tokens=12, use_chat_template=False)
    ours = HFGenerator().generate(policy, prompts, sampling)
    assert takes_cache(policy.model)
    policy.model.generation_config.cache_implementation = "static"
    assert not takes_cache(policy.model)
    own = HFGenerator().generate(policy, prompts, sampling)
    assert [g.completion_ids for g in own] == [g.completion_ids for g in ours]
