"""Sharded training (``trainer.sharding=fsdp2``): a policy's learner split across the processes with torch's
FSDP2 (``fully_shard``).

Each rank holds 1/n of the learner's fp32 master weights, gradients and AdamW state; the policy's own model stays
whole on every rank and serves what needs the weights in one piece without collectives (rollouts, the old-policy
and reference scoring, checkpoints), refreshed from the learner after every update (``gather_into``). The loss
forward and backward run on the learner: every rank runs them the same number of times (the update gives each
rank an equal count of rows per mini-batch), FSDP2 gathers each block's weights for its forward and
reduce-scatters the averaged gradients, so the update is one process's on the same rows.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from marl_cli.training.distributed import World


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards as units: the model's own unsplittable blocks (its decoder layers, named by
    transformers' ``_no_split_modules``); the root takes what is left (embeddings, final norm, head)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def sharded_copy(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """A copy of ``model`` whose parameters are split across ``world``'s processes: each block, then the root,
    sharded with ``fully_shard`` over one mesh of every rank."""
    learner = copy.deepcopy(model)
    mesh = init_device_mesh(next(model.parameters()).device.type, (world.size,))
    for block in blocks(learner):
        fully_shard(block, mesh=mesh)
    fully_shard(learner, mesh=mesh)
    return learner


@torch.no_grad()
def gather_into(learner: torch.nn.Module, whole: torch.nn.Module) -> None:
    """Copy the sharded ``learner``'s weights into ``whole`` (its unsharded twin) on every rank; every rank calls
    it (each sharded parameter is all-gathered)."""
    target = dict(whole.named_parameters())
    for name, param in learner.named_parameters():
        value = param.full_tensor() if isinstance(param, DTensor) else param
        target[name].copy_(value)


def optimizer_state(learner: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's whole state (every parameter's whole moments), keyed by parameter name, so a run with any
    number of processes loads it; across processes every rank calls it and rank 0's holds it, on the CPU."""
    gathered = dist.is_available() and dist.is_initialized()
    return get_optimizer_state_dict(learner, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=gathered))


def load_optimizer_state(learner: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``optimizer_state``'s whole state into this rank's share of it (every rank, each from the whole state)."""
    set_optimizer_state_dict(learner, optimizer, state, options=StateDictOptions(full_state_dict=True))
