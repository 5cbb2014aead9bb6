"""Arguments marl passes to every TRL config it builds (``GRPOConfig`` for the update, ``SFTConfig`` for the warm
start)."""

from __future__ import annotations

from dataclasses import fields

from transformers import TrainingArguments


def checkpointing_off() -> dict[str, bool]:
    """TRL's configs switch activation checkpointing on by default; marl switches it on itself, on the model
    (``trainer.gradient_checkpointing``), so TRL must not. Recent transformers call it ``activation_checkpointing``
    and warn on every config given the old name ``gradient_checkpointing``; older ones know only the old name."""
    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": False}
