"""Loading the model and tokenizer a policy starts from, and formatting prompts for it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from marl_cli.config.errors import ConfigError
from marl_cli.policies.tiny import save_tiny

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_source(model_cfg: Any, seed: int, workdir: Path, suffix: str = "") -> str:
    """A path or hub id to load from: the configured one, or a freshly saved tiny model (``tiny_init<suffix>``)."""
    if model_cfg.name_or_path:
        return str(model_cfg.name_or_path)
    target = workdir / f"tiny_init{suffix}"
    save_once(target, lambda path: save_tiny(model_cfg.tiny, seed, path))
    return str(target)


def save_once(target: Path, save: Callable[[Path], object]) -> None:
    """``save`` a model dir to ``target`` unless it holds one (written aside, then renamed). In a
    multi-process run every process calls this together: rank 0 writes (transformers saves weights
    from the main process only) and the others wait for it."""
    distributed = dist.is_available() and dist.is_initialized()
    if not (target / "config.json").exists() and (not distributed or dist.get_rank() == 0):
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        save(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    if distributed:
        dist.barrier()


def load_model(source: str, dtype: str, device: torch.device) -> PreTrainedModel:
    """A causal LM from a local dir or hub id."""
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r} is not supported; choose from: {', '.join(DTYPES)}")
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a model from {source}: {_first_line(exc)}") from exc
    return model.to(device)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """A tokenizer padded on the left (for batched generation) with a pad token."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {source}: {_first_line(exc)}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def format_prompt(tokenizer: PreTrainedTokenizerBase, text: str, use_chat_template: bool, system: str | None = None,
                  template_kwargs: dict[str, Any] | None = None) -> str:
    """``text`` as a user turn (after the ``system`` message, if any) when the tokenizer has a chat template and
    it is wanted, else as is; ``template_kwargs`` go to the template (Qwen3: ``enable_thinking``)."""
    if use_chat_template and tokenizer.chat_template:
        messages = [{"role": "system", "content": system}] if system else []
        return tokenizer.apply_chat_template([*messages, {"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, **(template_kwargs or {}))
    return text
