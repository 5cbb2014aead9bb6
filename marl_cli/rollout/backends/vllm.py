"""The ``vllm`` rollout backend's registration (``rollout=vllm``); the generator is
``marl_cli.rollout.vllm_generator.VLLMGenerator``, imported only when a run uses it."""

from __future__ import annotations

from typing import Any

from marl_cli.rollout.backends.base import BACKENDS, Generator, Requirement
from marl_cli.rollout.vllm_install import INSTALL


@BACKENDS.register("vllm")
def vllm_backend(cfg: Any) -> Generator:
    """vLLM engines in this process (``rollout.vllm.*``): one per full-model policy, or one base engine serving
    an adapter regime's policies as LoRA requests."""
    from marl_cli.policies.roles import uses_adapters
    from marl_cli.rollout.vllm_generator import VLLMGenerator

    lora_rank = cfg.policy.lora_r if uses_adapters(cfg.policy) else None
    return VLLMGenerator(cfg.rollout.vllm, cfg.model.dtype, cfg.rollout.max_prompt_length + cfg.rollout.max_new_tokens,
                         cfg.seed, lora_rank, max_loras=max(len(cfg.workflow.roles), 1))


vllm_backend.requires = Requirement("vllm", INSTALL)
