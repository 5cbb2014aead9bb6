"""``rollout.hf.cache=static``: transformers' fixed-size cache (compiled on CUDA), prompts padded to a width multiple,
samples what the default path samples (in float64: the two differ only in float order and in their position ids,
which rotary embeddings make relative)."""

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.training.build import sampling_from
from marl_cli.training.learner.policy_trainer import PolicyTrainer, collate
from tests.helpers import train_config
from tests.policies.test_tiny import SMALL
from tests.precision import eps, to_float64
from tests.training.learner.test_update_contracts import SAMPLER_GAP

PROMPTS = [f"Go from S to G on grid {'x' * 5 * i}{i}. Answer after ####." for i in range(4)]
GAP = 2 * 16 * eps(torch.float32)
"""Two samplers' log-probs of one token: float64 scorings a few float64 roundings apart, each then rounded to float32
(one rounding of a log-prob above −16 nats; ``SAMPLER_GAP`` against the learner's float64 ones)."""


@pytest.fixture
def policy(tmp_path, monkeypatch):
    cfg = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return to_float64(build_policies({"agent": "shared"}, cfg, 0, tmp_path, torch.device("cpu"))["shared"],
                      monkeypatch)


def test_greedy_completions_are_the_default_paths(policy):
    prompts = [p for p in PROMPTS for _ in range(2)]
    plain = HFGenerator().generate(policy, prompts, Sampling(0.0, max_new_tokens=24, use_chat_template=False))
    static = HFGenerator().generate(policy, prompts, Sampling(0.0, max_new_tokens=24, use_chat_template=False,
                                                              cache="static", width_multiple=16))
    assert [g.prompt_ids for g in static] == [g.prompt_ids for g in plain]  # the padding stays out of the rows
    assert [g.completion_ids for g in static] == [g.completion_ids for g in plain]
    for one, other in zip(static, plain, strict=True):
        assert one.logprobs == pytest.approx(other.logprobs, abs=GAP)


def test_sampled_log_probs_are_the_learners(policy, tmp_path):
    torch.manual_seed(0)
    gens = HFGenerator().generate(policy, PROMPTS * 2, Sampling(1.0, max_new_tokens=16, use_chat_template=False,
                                                                cache="static", width_multiple=64))
    rows = [Sample(task=i, branch=0, turn=0, role="agent", policy="shared", prompt_ids=g.prompt_ids,
                   completion_ids=g.completion_ids, reward=0.0, sampling_logprobs=g.logprobs)
            for i, g in enumerate(gens)]
    trainer = PolicyTrainer(policy, OmegaConf.structured(TrainerConfig()), temperature=1.0, max_completion_length=16,
                            output_dir=tmp_path / "trl", seed=0)
    learner = trainer._logps(policy.model, collate(rows, policy.tokenizer.pad_token_id, torch.device("cpu")))
    for i, g in enumerate(gens):
        assert g.logprobs == pytest.approx(learner[i, :len(g.completion_ids)].tolist(), abs=SAMPLER_GAP)


def test_the_config_reaches_the_generator():
    cfg = train_config("rollout.hf.cache=static", "rollout.hf.width_multiple=32")
    sampling = sampling_from(cfg)
    assert (sampling.cache, sampling.width_multiple) == ("static", 32)
