"""The ``vllm`` rollout backend's registration (``rollout=vllm``); the generator is
``marl_cli.rollout.vllm_generator.VLLMGenerator``, imported only when a run uses it.

Its check (``check_engines``, before any model is built) counts the engines one process starts, one per
full-model policy (an adapter regime: one per base model), and refuses a run whose engines cannot all fit: on a
GPU their ``rollout.vllm.gpu_memory_utilization`` shares add up to more than the card, on vLLM's CPU build their KV
caches (``rollout.vllm.cpu_kv_cache_gib`` each, or ``VLLM_CPU_KVCACHE_SPACE``) to more than the machine's memory.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
from typing import Any

from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.team import policy_models, role_sampling
from marl_cli.rollout.backends.base import BACKENDS, Generator, Requirement
from marl_cli.rollout.vllm_install import INSTALL

GIB = 1024 ** 3


def engine_policies(cfg: Any) -> list[str]:
    """The policies one process of the run starts an engine for, in the order the roles first name them: each
    full-model policy its roles act through (a decoupled sub trainer: its sub roles'), or under an adapter regime
    each frozen base the adapters are served from (one per model config: ``lora_base``, ``lora_base_<policy>``)."""
    from marl_cli.policies.roles import lora_bases, role_map, sub_roles, uses_adapters

    roles = role_map(cfg)
    if uses_adapters(cfg.policy):
        return list(dict.fromkeys(lora_bases(roles, cfg.model, policy_models(cfg)).values()))
    if OmegaConf.select(cfg, "trainer.role") == "sub":
        roles = {r: roles[r] for r in sub_roles(cfg, roles)}
    return list(dict.fromkeys(roles.values()))


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` package, or a ``+cpu`` version), read from the
    package metadata without importing vLLM."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False


def memory_gib() -> float | None:
    """This machine's physical memory in GiB (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError):
        return None


def check_engines(cfg: Any) -> None:
    """That the engines one process starts fit beside each other (one-line ``ConfigError`` otherwise): on a GPU
    each takes ``gpu_memory_utilization`` of the card's memory (weights and KV cache), so n engines need
    n x that <= 1; on vLLM's CPU build each allocates its KV cache up front, so n caches must fit in memory."""
    names = engine_policies(cfg)
    if len(names) < 2:
        return  # one engine: gpu_memory_utilization <= 1 by its schema; vLLM checks one cache itself
    from marl_cli.policies.roles import uses_adapters

    each = "base model" if uses_adapters(cfg.policy) else "policy"
    engines = f"rollout=vllm runs {len(names)} engines (one per {each}: {', '.join(names)})"
    settings = cfg.rollout.vllm
    if not vllm_on_cpu():
        share = settings.gpu_memory_utilization
        total = share * len(names)
        if total > 1.0 + 1e-9:
            devices = ",".join(f"cuda:{i}" for i in range(len(names)))
            raise ConfigError(
                f"{engines} at rollout.vllm.gpu_memory_utilization={share} each: {total:.3g} of one GPU's memory; "
                f"lower it to at most {math.floor(100 / len(names)) / 100} (the learner needs room beside them), "
                "or serve roles from one base (policy=lora_per_role: one engine per base model), or generate with "
                f"rollout=hf and place each policy on its own GPU (policy.devices=[{devices}])")
        return
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    per_engine, key = ((int(env), f"VLLM_CPU_KVCACHE_SPACE={env}") if env.strip().isdigit()
                       else (settings.cpu_kv_cache_gib, f"rollout.vllm.cpu_kv_cache_gib={settings.cpu_kv_cache_gib}"))
    memory = memory_gib()
    if memory is not None and per_engine * len(names) > memory:
        fits = math.floor(memory / len(names))
        fix = f"lower it to at most {fits}" if fits >= 1 else "run fewer policies (policy=shared or lora_per_role)"
        raise ConfigError(f"{engines} with a {per_engine} GiB KV cache each ({key}): {per_engine * len(names)} GiB, "
                          f"more than this machine's {memory:.1f} GiB of memory; {fix}")


def longest_completion(cfg: Any) -> int:
    """The most new tokens any role may sample, in training or evaluation (``rollout.max_new_tokens``, or a role's
    own ``rollout.roles.<role>.max_new_tokens`` / ``eval.roles.<role>.max_new_tokens``)."""
    budgets = [cfg.rollout.max_new_tokens]
    for role in cfg.workflow.roles:
        for evaluation in (False, True):
            budgets.append(role_sampling(cfg, role, evaluation).get("max_new_tokens", cfg.rollout.max_new_tokens))
    return max(budgets)


@BACKENDS.register("vllm", check=check_engines)
def vllm_backend(cfg: Any) -> Generator:
    """vLLM engines in this process (``rollout.vllm.*``): one per full-model policy, or one engine per base model
    serving an adapter regime's policies of that base as LoRA requests; each holds the prompt limit plus the longest
    completion any role samples."""
    from marl_cli.policies.roles import uses_adapters
    from marl_cli.rollout.vllm_generator import VLLMGenerator

    lora_rank = cfg.policy.lora_r if uses_adapters(cfg.policy) else None
    return VLLMGenerator(cfg.rollout.vllm, cfg.model.dtype, cfg.rollout.max_prompt_length + longest_completion(cfg),
                         cfg.seed, lora_rank, max_loras=max(len(cfg.workflow.roles), 1))


vllm_backend.requires = Requirement("vllm", INSTALL)
