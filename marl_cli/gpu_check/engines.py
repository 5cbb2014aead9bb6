"""The checks of ``rollout=vllm``: an engine colocated with the learner generates what HF generates from the same
weights (greedy, float32: exact), samples with the learner's log-probs, frees its memory asleep and samples the
weights pushed after an update when it wakes, and does all of it split over 2 GPUs (tensor parallelism)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import VLLMConfig
from marl_cli.gpu_check.checks import Figures, Setup, Skip, expect
from marl_cli.gpu_check.common import grpo_rows, tiny_policy, trainer
from marl_cli.policies.regime import Policy
from marl_cli.rollout.generation import Generation, HFGenerator, Sampling, encode_prompts
from marl_cli.rollout.vllm_generator import VLLMGenerator, import_vllm

PROMPTS = [f"Grid {i}: go from S to G avoiding #. " + "S.#G"[i % 4:] * (i % 3 + 1) for i in range(8)]
GREEDY = Sampling(0.0, max_new_tokens=16)
SAMPLED = Sampling(0.8, max_new_tokens=16)
LOGPROB_GAP = 1e-3
"""The largest sampler-vs-learner gap of a float32 engine's sampled-token log-probs (``make test-vllm``'s bound on
the CPU build); a token scored at the wrong position or temperature is off by more than 0.1."""
MEMORY_SHARE = 0.1
"""``rollout.vllm.gpu_memory_utilization`` of the checks' engines (the tiny model needs little of it)."""


def colocated(setup: Setup) -> Figures:
    """One engine in this process: greedy completions equal HF's from the learner's weights (pushed at the first
    call), and the log-probs of sampled tokens equal the learner's at the sampling temperature."""
    generator = _generator(setup)
    policy = _noisy_policy(setup, "vllm-colocated")
    start = time.perf_counter()
    greedy = generator.generate(policy, PROMPTS, GREEDY)
    started = time.perf_counter() - start
    equal = _equal_to_hf(policy, greedy)
    gaps = _gaps(policy, generator.generate(policy, PROMPTS, SAMPLED), SAMPLED.temperature)
    expect(max(gaps) <= LOGPROB_GAP, f"sampled log-probs are {max(gaps):.3g} nats from the learner's "
                                     f"(bound {LOGPROB_GAP})")
    return {"greedy = HF": equal, "logprob gap mean": sum(gaps) / len(gaps), "logprob gap max": max(gaps),
            "engine start s": started}


def sleep_sync(setup: Setup) -> Figures:
    """Sleep mode (CUDA): the engine frees its memory while the policy trains one step, then wakes with the new
    weights pushed: greedy equals HF's from them. On the CPU build (no sleep mode) the push after the update alone."""
    asleep = setup.device == "cuda"
    generator = _generator(setup, enable_sleep_mode=asleep)
    policy = _noisy_policy(setup, "vllm-sleep")
    before = generator.generate(policy, PROMPTS, GREEDY)
    free = _free_gib() if asleep else 0.0
    generator.release()  # without sleep mode: nothing
    freed = _free_gib() - free if asleep else None
    if freed is not None:
        expect(freed > 0, f"the engine freed {freed:.3g} GiB going to sleep")
    syncs = generator.syncs
    trainer(policy, Path(setup.workdir) / "vllm-sleep", learning_rate=1e-2, mini_batch_size=16).update(
        grpo_rows(0), random.Random(0))
    after = generator.generate(policy, PROMPTS, GREEDY)
    expect(generator.syncs == syncs + 1, f"{generator.syncs - syncs} weight pushes after the update, not 1")
    changed = sum(a.completion_ids != b.completion_ids for a, b in zip(before, after, strict=True))
    return {"sleep mode": "on" if asleep else "off (CPU build)", "freed GiB": "n/a" if freed is None else freed,
            "greedy = HF after the update": _equal_to_hf(policy, after), "changed by the update": changed}


def tensor_parallel(setup: Setup) -> Figures:
    """An engine split over 2 GPUs (``tensor_parallel_size=2``): greedy equals HF's, and again after the learner's
    weights change (pushed to both halves)."""
    if setup.device != "cuda":
        raise Skip("tensor parallelism splits an engine over GPUs")
    setup.need_devices(2, "tensor_parallel_size=2")
    generator = _generator(setup, tensor_parallel_size=2)
    policy = _noisy_policy(setup, "vllm-tensor-parallel")
    before = _equal_to_hf(policy, generator.generate(policy, PROMPTS, GREEDY))
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)
    syncs = generator.syncs
    after = _equal_to_hf(policy, generator.generate(policy, PROMPTS, GREEDY))
    expect(generator.syncs == syncs + 1, f"{generator.syncs - syncs} weight pushes after the change, not 1")
    return {"greedy = HF": before, "after a push": after}


def _generator(setup: Setup, **settings: Any) -> VLLMGenerator:
    """A float32 generator (greedy comparisons are exact only there), or a skip without vLLM."""
    try:
        import_vllm()
    except ConfigError as exc:
        raise Skip("vLLM is not installed: pip install 'marl[vllm]'") from exc
    cfg = OmegaConf.structured(VLLMConfig(gpu_memory_utilization=MEMORY_SHARE, **settings))
    return VLLMGenerator(cfg, "float32", max_model_len=256, seed=0)


def _noisy_policy(setup: Setup, name: str) -> Policy:
    """The tiny float32 policy with noise on its weights: a freshly initialised one answers every prompt alike."""
    policy = tiny_policy(setup, name)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in policy.model.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.5).to(p.device))
    return policy


def _equal_to_hf(policy: Policy, generations: list[Generation]) -> str:
    """``n/n``: how many of the engine's greedy completions equal HF's from the learner's weights (all must, and
    they must differ across prompts, or the comparison tells nothing)."""
    hf = HFGenerator().generate(policy, PROMPTS, GREEDY)
    equal = sum(a.completion_ids == b.completion_ids for a, b in zip(generations, hf, strict=True))
    expect(equal == len(PROMPTS), f"{equal}/{len(PROMPTS)} greedy completions equal HF's")
    expect(len({tuple(g.completion_ids) for g in hf}) > 1, "every prompt got the same answer")
    return f"{equal}/{len(PROMPTS)}"


@torch.no_grad()
def _gaps(policy: Policy, generations: list[Generation], temperature: float) -> list[float]:
    """|sampler − learner| log-prob of every sampled token, the learner scoring each completion after its prompt."""
    prompt_ids, _ = encode_prompts(policy, PROMPTS, SAMPLED)
    gaps: list[float] = []
    for ids, g in zip(prompt_ids, generations, strict=True):
        expect(len(g.logprobs) == len(g.completion_ids) > 0, "the engine returned no log-probs")
        full = torch.tensor([ids + g.completion_ids], device=policy.model.device)
        logits = policy.model(full).logits[0, len(ids) - 1:-1].float() / temperature
        chosen = torch.tensor(g.completion_ids, device=logits.device)[:, None]
        learner = torch.log_softmax(logits, -1).gather(1, chosen)[:, 0].cpu()
        gaps += (learner - torch.tensor(g.logprobs)).abs().tolist()
    return gaps


def _free_gib() -> float:
    """The current GPU's free memory in GiB."""
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / 2 ** 30
