"""The learner's shared prompt pass (``rollout.prefix``): the gradient through each row's copy of its prompt's keys and
values is the same in every backward on several CPU threads (the rows of one prompt spread across the batch)."""

import hashlib

import pytest
import torch

from marl_cli.config.schema import TinyModelConfig
from marl_cli.policies.tiny import build_tiny_model
from marl_cli.rollout.prefix import keeping_cache, shared_prompt_cache
from tests.helpers import torch_threads


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


def test_the_shared_prompt_gradient_is_the_same_in_every_backward(two_threads):
    model = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16), 99, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts, width, tail = 4, 126, 12
    distinct = torch.randint(3, 99, (prompts, width), generator=g)
    ids = torch.cat([distinct.repeat(6, 1), torch.randint(3, 99, (6 * prompts, tail), generator=g)], dim=1)
    mask = torch.ones_like(ids)  # 24 rows, row i of prompt i % 4: each prompt's rows on both threads' halves
    seen = set()
    for _ in range(12):
        model.zero_grad(set_to_none=True)
        with keeping_cache(model):
            cache = shared_prompt_cache(model, ids[:, :width], mask[:, :width], replayable=True)
            assert cache is not None and cache[next(iter(cache))].layers[0].keys.numel() >= 32768  # torch's grain
            out = model(input_ids=ids[:, width - 1:], attention_mask=mask, **cache)
        out.logits.float().log_softmax(-1).mean().backward()
        seen.add(hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in model.parameters())).hexdigest())
    assert len(seen) == 1
