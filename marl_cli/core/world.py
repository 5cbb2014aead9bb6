"""Who this process is among a run's processes (``torchrun`` / ``accelerate launch``) and the collectives every layer
uses: joining the launcher's process group, the rank and size, gathering and broadcasting objects and tensors.

Every rank holds every policy and the step's full table of rows; rank 0 alone writes metrics, summaries, samples and
checkpoints (``World.main``). How a step's work is dealt to the ranks is ``training/rows/distributed.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from marl_cli.config.launch import launched_world_size

T = TypeVar("T")


def init_from_launcher() -> None:
    """Join the launcher's process group once (gloo for CPU tensors, NCCL for CUDA ones, each process on
    the GPU of its ``LOCAL_RANK``); a no-op for one process."""
    if launched_world_size() > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("cpu:gloo,cuda:nccl")
        else:
            dist.init_process_group("gloo")


def launch_overrides(args: list[str]) -> list[str]:
    """Hydra overrides for a ``marl train`` started by a launcher: every rank gets rank 0's run dir (its
    timestamp), and only rank 0 writes Hydra's files there (the other ranks log to the console)."""
    if launched_world_size() == 1:
        return []
    init_from_launcher()
    world = World.current()
    out = []
    if not any(arg.startswith("hydra.run.dir=") for arg in args):
        out.append(f"hydra.run.dir=outputs/${{name}}/{world.from_main(time.strftime('%Y-%m-%d_%H-%M-%S'))}")
    if not world.main:
        out += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    return out


@dataclass(frozen=True)
class World:
    """This process's place among the run's processes.

    Args:
        rank: this process's index (0 writes the run's files).
        size: how many processes train the run.
    """

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        """The process group this process joined (``init_from_launcher``), or one process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def main(self) -> bool:
        """Whether this process writes the run's files."""
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every ``size``-th, starting at ``rank``."""
        return list(items[self.rank::self.size])

    def global_index(self, local: int) -> int:
        """The index in the full sequence of this rank's ``local``-th item of ``share``."""
        return self.rank + local * self.size

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (any picklable value), in rank order."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def from_main(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy rank 0's parameters and buffers into ``module`` on every rank."""
        if self.size == 1:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def average_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its mean over the ranks (a missing gradient counts as zero)."""
        if self.size == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(self.size)

