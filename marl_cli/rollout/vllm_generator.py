"""The ``vllm`` rollout backend: vLLM engines colocated in this process, kept in sync with the learner.

One engine per full-model policy (``shared``: one; ``per_role``: one per role's model; ``lora_per_role``:
one engine per frozen base, each policy's adapter a LoRA request on its base's), each started from its own source,
so a team of different models (``policy.models``) gets engines of different architectures, tokenizers, dtypes
and context lengths. Before each
generate call the generator compares the policy's weights' fingerprint with what the engine last received
(``fingerprint``: the policy's update count, bumped by every optimiser step, warm start, checkpoint load
and decoupled weight exchange, and torch's in-place version counter of every parameter) and pushes the
learner's weights into the engine when anything changed: no caller has to remember to sync. Completions
come back as the ``hf`` backend returns them: the prompt as the model saw it (left-truncated to
``max_prompt_length``), the completion token for token up to and including its first end token, and the
sampler's log-probability of every sampled token after temperature, min-p, top-k and top-p
(``logprobs_mode=processed_logprobs``), which is what the learner's log-probabilities are checked against
(``train/<policy>/logprob_gap/*``). Each call samples as its role does (``Sampling.for_role``: temperature,
top-k, top-p, min-p, new tokens, stop strings), and a completion that meets a stop string is cut where the
``hf`` backend cuts it (``as_sampled``).

The engines run in this process and, without per-request seeds, sample from torch's default generator of their
device, as the ``hf`` backend does; starting an engine (which seeds every generator and samples a probe token)
leaves those generators as they were (``generators_kept``), so the checkpoint's generator states decide what a
resumed run samples, whenever its engines start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl_cli.config.errors import ConfigError
from marl_cli.policies.regime import Policy
from marl_cli.rollout.generation import Generation, Sampling, as_sampled, encode_prompts, end_token_ids
from marl_cli.rollout.vllm_install import INSTALL

log = logging.getLogger(__name__)

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA ranks a vLLM engine can be sized for (``max_lora_rank``); an adapter's rank may be smaller."""


def import_vllm() -> Any:
    """The ``vllm`` module, or a one-line error saying how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights sync in place
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"rollout=vllm needs vllm: {INSTALL}") from exc
    return vllm


def fingerprint(policy: Policy) -> tuple[int, tuple[tuple[int, int], ...]]:
    """What identifies a policy's current weights without reading them: the policy's own update count
    (``Policy.mark_updated``: optimiser steps, warm starts, loads; fused optimisers write parameters
    without touching torch's counters) and each parameter's object and in-place version (any other
    in-place write)."""
    return policy.version, tuple((id(p), p._version) for p in policy.model.parameters())


class VLLMGenerator:
    """Generates with one vLLM engine per full-model policy, syncing the learner's weights before use.

    Under an adapter regime (``lora_rank`` set) one engine serves each frozen base (``Policy.base``) and every
    policy is a LoRA request on its base's: the base weights are pushed once the adapters are attached, and each
    adapter is written to a temporary dir and requested under a new id whenever its policy changed.

    Args:
        settings: ``rollout.vllm`` (memory share, tensor-parallel size, sleep mode, KV cache on CPU).
        dtype: the engines' dtype (``model.dtype``) where a policy has no compute dtype of its own (each engine
            runs its policy's: ``policy.models.<policy>.dtype``).
        max_model_len: the longest sequence an engine serves (prompt limit + the longest completion any role
            samples; its model's ``max_position_embeddings`` at most) unless ``rollout.vllm.max_model_len`` says
            otherwise.
        seed: the engines' sampling seed (each process of a multi-process run adds its rank).
        lora_rank: the adapters' rank (``policy.lora_r``) under an adapter regime, else None.
        max_loras: how many adapters one batch of an engine may mix (the regime's policies).
    """

    def __init__(self, settings: Any, dtype: str, max_model_len: int, seed: int, lora_rank: int | None = None,
                 max_loras: int = 1):
        launched = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        self.settings, self.dtype, self.seed = settings, dtype, seed + (torch.distributed.get_rank() if launched else 0)
        # under a launcher each process's engine runs on its own device (LOCAL_RANK) in the processes' group
        self.launcher = {"distributed_executor_backend": "external_launcher"} if launched else {}
        self.max_model_len = settings.max_model_len or max_model_len
        self.lora_rank, self.max_loras = lora_rank, max_loras
        self.engines: dict[str, Any] = {}
        self.synced: dict[str, Any] = {}
        self.adapters: dict[str, tuple[Any, Any]] = {}  # policy name → (fingerprint, LoRA request)
        self.adapter_dir = tempfile.TemporaryDirectory(prefix="marl-vllm-lora-")
        self.calls = 0
        self.syncs = 0

    def start(self, policies: list[Policy]) -> None:
        """Start the engines ``policies`` need, in their order. Under a launcher an engine joins the processes'
        group when it starts (each process's engine then generates on its own: vLLM's external data
        parallelism), so every process calls this at once with the same policies before playing its share."""
        for policy in policies:
            key = self._key(policy)
            if key not in self.engines:
                self.engines[key] = self._start(policy)

    @staticmethod
    def _key(policy: Policy) -> str:
        """The engine serving ``policy``: its own, or an adapter's base's (named as the base was before the
        adapters attached, so the warm-started base's engine serves its adapters)."""
        return policy.base or policy.name

    def engine(self, policy: Policy) -> Any:
        """The engine serving ``policy``'s model, started on first use, holding the learner's current weights
        (an adapter policy's: its frozen base)."""
        key = self._key(policy)
        if key in self.engines and self.settings.enable_sleep_mode:
            self.engines[key].wake_up()
        self.start([policy])
        if policy.adapter is None:
            state = fingerprint(policy)
            weights = policy.model.state_dict().items()
        else:  # the base is frozen once the adapters are attached: pushed once, without the adapters' weights
            state = ("base of adapters", id(policy.model))
            weights = ((name.replace(".base_layer.", "."), tensor)
                       for name, tensor in policy.model.get_base_model().state_dict().items() if "lora_" not in name)
        if self.synced.get(key) != state:
            start = time.perf_counter()
            self.engines[key].collective_rpc("reload_weights", kwargs={
                "weights_iterator": [(name, tensor.detach()) for name, tensor in weights]})
            # cached prompt blocks hold keys and values the old weights computed
            self.engines[key].reset_prefix_cache()
            self.synced[key] = state
            self.syncs += 1
            log.debug("vllm: synced %s's weights (%.2f s)", policy.name, time.perf_counter() - start)
        return self.engines[key]

    def lora_request(self, policy: Policy) -> Any:
        """The LoRA request serving ``policy``'s adapter as it is now (None for a full model)."""
        if policy.adapter is None:
            return None
        state = fingerprint(policy)
        known = self.adapters.get(policy.name)
        if known is not None and known[0] == state:
            return known[1]
        vllm = import_vllm()
        lora_id = self.syncs + 1
        path = Path(self.adapter_dir.name) / f"{policy.name}-{lora_id}"
        policy.save(path)
        if known is not None:
            shutil.rmtree(known[1].lora_path, ignore_errors=True)
        request = vllm.lora.request.LoRARequest(f"{policy.name}-{lora_id}", lora_id, str(path))
        self.adapters[policy.name] = (state, request)
        self.syncs += 1
        return request

    def _start(self, policy: Policy) -> Any:
        vllm = import_vllm()
        s = self.settings
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(s.cpu_kv_cache_gib))
        # vLLM's CPU build drops torch to one thread unless OMP_NUM_THREADS is set; the learner shares this process
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        start = time.perf_counter()
        longest = getattr(policy.model.config, "max_position_embeddings", None) or self.max_model_len
        max_model_len = min(self.max_model_len, longest)
        dtype = str(policy.compute_dtype).removeprefix("torch.") if policy.compute_dtype else self.dtype
        try:
            with generators_kept():  # the engine seeds every generator and samples a token
                engine = vllm.LLM(model=policy.source, tokenizer=policy.source, dtype=dtype, seed=self.seed,
                                  max_model_len=max_model_len,
                                  gpu_memory_utilization=s.gpu_memory_utilization,
                                  tensor_parallel_size=s.tensor_parallel_size, enable_sleep_mode=s.enable_sleep_mode,
                                  enforce_eager=s.enforce_eager, logprobs_mode="processed_logprobs",
                                  enable_prefix_caching=s.enable_prefix_caching, **self.launcher, **self._lora_args())
                # one token through the model: kernels that do not support it fail here, not mid-rollout
                engine.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[0])], vllm.SamplingParams(max_tokens=1),
                                use_tqdm=False)
        except (ValueError, RuntimeError, OSError) as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
            first = next((line for line in lines if line.startswith("Value error,")), lines[0])
            raise ConfigError(f"rollout=vllm could not run {policy.source}: {first}") from exc
        log.info("vllm: engine for policy %s (%s, %s, max_model_len %d) started in %.1f s", policy.name,
                 policy.source, dtype, max_model_len, time.perf_counter() - start)
        return engine

    def _lora_args(self) -> dict[str, Any]:
        if not self.lora_rank:
            return {}
        rank = next((r for r in LORA_RANKS if r >= self.lora_rank), None)
        if rank is None:
            raise ConfigError(f"rollout=vllm serves LoRA ranks up to {LORA_RANKS[-1]}; policy.lora_r={self.lora_rank}")
        return {"enable_lora": True, "max_lora_rank": rank, "max_loras": self.max_loras}

    def release(self) -> None:
        """Before the policies train: with ``rollout.vllm.enable_sleep_mode`` every engine frees its GPU memory
        (weights and KV cache, sleep level 2); the next generate call wakes it and pushes the weights again."""
        if not self.settings.enable_sleep_mode:
            return
        for key, engine in self.engines.items():
            engine.sleep(level=2)
            self.synced.pop(key, None)

    def generate(self, policy: Policy, prompts: list[str], sampling: Sampling) -> list[Generation]:
        vllm = import_vllm()
        engine = self.engine(policy)
        prompt_ids, truncated = encode_prompts(policy, prompts, sampling)
        ends = end_token_ids(policy)
        outputs = engine.generate([vllm.inputs.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                                  sampling_params(vllm, sampling, ends), use_tqdm=False,
                                  lora_request=self.lora_request(policy))
        self.calls += 1
        results = []
        for ids, cut, out in zip(prompt_ids, truncated, outputs, strict=True):
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], tokens, strict=False)]
            results.append(as_sampled(policy, ids, tokens, logprobs, cut, ends, sampling.stop))
        return results


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """Python's, numpy's and torch's default generators (this process's accelerator's too) as they were before."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(python)
    np.random.set_state(numpy)


def sampling_params(vllm: Any, sampling: Sampling, ends: list[int]) -> Any:
    """vLLM's ``SamplingParams`` for ``sampling`` (one role's: ``Sampling.for_role``): its temperature (0: greedy,
    every filter off), top-k, top-p, min-p and new-token budget, stopping at the end tokens and after the token that
    completes a stop string. Stop strings are matched on the detokenized text, so only they turn detokenizing on;
    the completion is cut again by ``as_sampled`` (as the ``hf`` backend cuts its own), so both keep the same
    tokens."""
    greedy = sampling.temperature <= 0
    stops = list(sampling.stop)
    return vllm.SamplingParams(
        temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
        top_k=0 if greedy else sampling.top_k, min_p=0.0 if greedy else sampling.min_p,
        max_tokens=sampling.max_new_tokens, stop_token_ids=ends, stop=stops or None,
        include_stop_str_in_output=bool(stops), logprobs=0, detokenize=bool(stops))
