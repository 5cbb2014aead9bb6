"""The checks of multi-process training: the same rows trained by 2 processes (NCCL on GPUs, one each; gloo on the
CPU) and by 1 give the same update, data-parallel (``nccl``) and with the learner sharded by FSDP2 while rows share
their prompts (``fsdp2``)."""

from __future__ import annotations

import os
import random
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from marl_cli.core.world import World, init_from_launcher
from marl_cli.gpu_check.checks import Figures, Setup, expect
from marl_cli.gpu_check.common import Distance, grpo_rows, relative, tiny_policy, trainer, weights

LEARNING_RATE = 1e-3
TERMS = 4096
"""An upper bound on the float32 terms along the longest accumulation of the update's numbers: a 384-wide dot
product, then ≤ 16 rows × ≤ 64 completion tokens of a mini-batch, then 2 ranks' halves."""
SAME_STATS = TERMS * torch.finfo(torch.float32).eps
"""The loss and gradient norm of 1 and 2 processes: two float orders of a ``TERMS``-term float32 accumulation."""
SAME_UPDATE = 0.01
"""The weights of 1 and 2 processes, on average, as a fraction of the update: Adam divides each gradient entry by its
own size, so an entry within float noise of zero may move a whole step either way; the rest agree to float32's
rounding (a dropped row or a wrongly weighted rank moves them by a tenth of the update or more)."""


def data_parallel(setup: Setup) -> Figures:
    """Two steps of the same rows in 2 processes (each its half of every mini-batch, gradients averaged) and in 1."""
    return _against_one_process(setup, "none")


def fsdp2(setup: Setup) -> Figures:
    """The same with ``trainer.sharding=fsdp2``: each rank holds half of every layer, rows share prompts (the prompt
    pass back-propagated with its layer gathered again), and the update is one process's."""
    return _against_one_process(setup, "fsdp2")


def _against_one_process(setup: Setup, sharding: str) -> Figures:
    setup.need_devices(2, "a 2-process update")
    one = update(setup, World(), "none", "one-process")
    two = in_two_processes(setup, sharding)
    figures: Figures = {"backend": two["backend"]}
    for i, (a, b) in enumerate(zip(one["stats"], two["stats"], strict=True)):
        for key in ("loss", "grad_norm"):
            gap = relative(b[key], a[key])
            expect(gap <= SAME_STATS, f"step {i + 1}'s {key} differs by {gap:.3g} (relative; bound {SAME_STATS:.3g})")
        figures[f"loss gap step {i + 1}"] = relative(b["loss"], a["loss"])
    distance = Distance.between(one["end"], two["end"], one["start"])
    expect(distance.mean_ratio <= SAME_UPDATE, f"the weights differ by {distance.mean_ratio:.3g} of the update on "
                                               f"average (bound {SAME_UPDATE})")
    if sharding == "fsdp2":
        expect(two["local_share"] == 0.5, f"rank 0 holds {two['local_share']:.3g} of the layers' weights, not half")
        figures["rank 0's share"] = two["local_share"]
    figures.update({"weights gap": distance.mean_ratio, "max |Δw| / lr": distance.max_abs / LEARNING_RATE})
    return figures


def update(setup: Setup, world: World, sharding: str, name: str, rank: int = 0) -> dict[str, Any]:
    """Two steps of GRPO rows (groups sharing a prompt; mini-batches of 8) of the float32 tiny policy on process
    ``rank``'s device: its whole weights before and after, the steps' statistics, and the share of the decoder
    layers' weights this rank holds."""
    policy = tiny_policy(setup, name, rank=rank)
    start = weights(policy.model)
    learner = trainer(policy, Path(setup.workdir) / name, world, learning_rate=LEARNING_RATE, mini_batch_size=8,
                      loss_type="bnpo", sharding=sharding)
    stats = [learner.update(grpo_rows(step), random.Random(step)) for step in range(2)]
    layers = learner.learner.model.layers.parameters()
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in layers)
    share = local / sum(p.numel() for p in learner.model.model.layers.parameters())
    return {"start": start, "end": weights(learner.model), "stats": stats, "local_share": share}


def in_two_processes(setup: Setup, sharding: str) -> dict[str, Any]:
    """``update`` run by two processes of one group (NCCL for CUDA tensors, gloo on the CPU): rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="marl-gpu-check-") as tmp:
        out = Path(tmp) / "rank0.pt"
        torch.multiprocessing.spawn(_worker, args=(_free_port(), setup, sharding, str(out)), nprocs=2, join=True)
        return torch.load(out, weights_only=False)


def _worker(rank: int, port: int, setup: Setup, sharding: str, out: str) -> None:
    """One of the two processes, as a launcher starts it (rank, world size and address in the environment)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    if setup.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        torch.set_num_threads(1)
    init_from_launcher()
    try:
        result = update(setup, World.current(), sharding, f"{sharding}-two-processes", rank)  # rank 0 saves it
        result["backend"] = str(dist.get_backend())
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
