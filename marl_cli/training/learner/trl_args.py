"""Where marl imports TRL, and the arguments marl passes to every TRL config it builds (``GRPOConfig`` for the
update, ``SFTConfig`` for the warm start).

TRL is imported here only, with its start-up noise silenced at the source: TRL's warning about an untested
vLLM version (raised from each of its call sites, five times a run) shows once, and transformers' W&B
integration, which marl never uses (every TRL config gets ``report_to="none"``; marl's tracker talks to W&B
itself), does not print "Running in WANDB offline mode" as it is imported.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields

from transformers import TrainingArguments

VLLM_VERSION_WARNING = r"TRL currently supports vLLM versions"
"""The start of TRL's warning (``trl.import_utils.is_vllm_available``) about an installed vLLM it has not tested."""


@contextmanager
def hidden_env(name: str) -> Iterator[None]:
    """Run the block with the environment variable ``name`` unset, then restore it."""
    value = os.environ.pop(name, None)
    try:
        yield
    finally:
        if value is not None:
            os.environ[name] = value


def vllm_warning_once() -> None:
    """Show TRL's vLLM version warning once per process, not once per TRL call site (it warns with
    ``stacklevel=2``, so Python's default shows it again for each caller)."""
    warnings.filterwarnings("once", message=VLLM_VERSION_WARNING, category=UserWarning)


vllm_warning_once()
with hidden_env("WANDB_MODE"):  # read once, as transformers' W&B integration module is imported (by TRL's)
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
    from trl.trainer.utils import add_fused_lm_head

__all__ = ["GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "add_fused_lm_head", "checkpointing_off",
           "vllm_warning_once"]


def checkpointing_off() -> dict[str, bool]:
    """TRL's configs switch activation checkpointing on by default; marl switches it on itself, on the model
    (``trainer.gradient_checkpointing``), so TRL must not. Recent transformers call it ``activation_checkpointing``
    and warn on every config given the old name ``gradient_checkpointing``; older ones know only the old name."""
    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": False}
