"""The checks ``marl gpu-check`` runs, by name, in table order, and what every check is given (``Setup``).

A check is a function of a ``Setup`` returning its figures (name → number or text); it raises ``Skip`` when this
machine cannot run it (one line saying why) and anything else to fail (``CheckFailed`` from ``expect``, with the
measured value in the message). Adding a check is one function and one entry of ``CHECKS``. Nothing here imports
torch: the registry is read before any check runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

Figures = dict[str, Any]


class Skip(Exception):
    """This machine cannot run the check; the message says why, in one line."""


class CheckFailed(Exception):
    """The check ran and what it measured is wrong; the message says what, in one line."""


def expect(condition: bool, message: str) -> None:
    """Fail the check with ``message`` unless ``condition`` (not ``assert``: it survives ``python -O``)."""
    if not condition:
        raise CheckFailed(message)


@dataclass(frozen=True)
class Setup:
    """What a check runs on.

    Args:
        device: ``cuda`` or ``cpu`` (the stand-in: gloo for NCCL, the CPU's autocast for bf16).
        devices: how many processes the multi-process checks may start, one per GPU on ``cuda``.
        dtype: the half-precision compute dtype (``bfloat16``; ``float32`` where the device lacks it).
        workdir: where the checks save their tiny models (one subdirectory each).
    """

    device: str
    devices: int
    dtype: str
    workdir: str

    def place(self, rank: int = 0) -> str:
        """The device of process ``rank`` (``cuda:<rank>``, or ``cpu``)."""
        return f"cuda:{rank}" if self.device == "cuda" else "cpu"

    def need_devices(self, count: int, what: str) -> None:
        """Skip unless ``count`` devices (GPUs; processes on the CPU) are there for ``what``."""
        if self.devices < count:
            unit = "GPUs" if self.device == "cuda" else "processes"
            raise Skip(f"{what} needs {count} {unit}; this machine has {self.devices}")


class Check(NamedTuple):
    target: str
    """``module:function`` under ``marl_cli.gpu_check``, imported when the check runs."""
    about: str


CHECKS: dict[str, Check] = {
    "device": Check("training:device", "torch, CUDA runtime, driver, GPU name, memory and count; a matmul on it"),
    "bf16-master": Check("training:bf16_master", "a bf16 policy trained with fp32 master weights at lr 1e-6"),
    "grad-checkpointing": Check("training:gradient_checkpointing",
                                "the same update with trainer.gradient_checkpointing=true, in less memory"),
    "vllm-colocated": Check("engines:colocated", "vLLM greedy = HF greedy; sampled log-prob gap to the learner"),
    "vllm-sleep": Check("engines:sleep_sync", "sleep mode: after an update the woken engine samples the new weights"),
    "nccl": Check("distributed:data_parallel", "a 2-process update (NCCL) = the 1-process update"),
    "fsdp2": Check("distributed:fsdp2", "FSDP2 over 2 processes, prompts shared = the 1-process update"),
    "tensor-parallel": Check("engines:tensor_parallel", "vLLM tensor_parallel_size=2: greedy = HF before and "
                                                        "after a weight push"),
    "async-rollouts": Check("training:async_rollouts", "trainer.max_staleness: rollouts overlapping the update"),
    "speed-tiny": Check("speed:speed_tiny", "marl vs raw TRL per step at equal work, the tiny model; the 3-turn "
                                           "embedded run's s/step at k=0 and k=1"),
    "speed-0.6b": Check("speed:speed_0_6b", "the same at Qwen3-0.6B's layers (random weights, character vocabulary), "
                                           "peak memory"),
    "speed-1.7b": Check("speed:speed_1_7b", "the same at Qwen3-1.7B's layers, peak memory"),
    "paper-cell": Check("paper_cell:paper_cell", "one update of the AT-GRPO Qwen3-1.7B cell at its real shape "
                                                 "(random weights), peak memory against the docs' arithmetic"),
}


def resolve(name: str) -> Callable[[Setup], Figures]:
    """The function of check ``name``."""
    module, function = CHECKS[name].target.split(":")
    return getattr(importlib.import_module(f"marl_cli.gpu_check.{module}"), function)
