"""Sharded training (``trainer.sharding=fsdp2``): a policy's learner split across the processes with torch's
FSDP2 (``fully_shard``).

Each rank holds 1/n of the learner's fp32 master weights, gradients and AdamW state. The policy keeps a whole
copy on every rank, in its compute dtype (bf16 for the paper cells: 2 bytes per parameter), for what needs the
weights in one piece without collectives — rollouts, a vLLM engine's sync, the reference — refreshed from the
learner after every update (``gather_into``). The scoring and the loss run on the learner: every rank runs
as many forward passes (the update gives each rank an equal count of rows per mini-batch), FSDP2 gathers each
block's weights for its forward and reduce-scatters the averaged gradients, so the update is one process's on the
same rows. Checkpoints hold the gathered fp32 masters (``master_weights``) and the whole optimiser state by
parameter name (``optimizer_state``), which any number of processes loads.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers.cache_utils import Cache

from marl_cli.core.world import World


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards as units: the model's own unsplittable blocks (its decoder layers, named by
    transformers' ``_no_split_modules``; sharded, each is an FSDP subclass of its own class); the root takes what is
    left (embeddings, final norm, head)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]


def split(model: torch.nn.Module, world: World, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(learner, whole)``: ``model`` itself sharded across ``world``'s processes (each block, then the root, over
    one mesh of every rank), and a frozen whole copy of it in ``dtype``, made parameter by parameter (never a
    second full copy in ``model``'s dtype)."""
    whole_params = {id(p): torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False)
                    for p in model.parameters()}
    whole = copy.deepcopy(model, memo=dict(whole_params))
    whole.__dict__.pop("forward", None)  # a copied forward patch (TRL's fused head) still calls the learner's
    mesh = init_device_mesh(next(model.parameters()).device.type, (world.size,))
    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, whole


class _Regather(torch.autograd.Function):
    """The identity on a prompt's cached keys and values; in the backward, ``block`` gathers its weights again
    before the prompt's own nodes in it run (the completions' backward through the block has resharded them)."""

    @staticmethod
    def forward(ctx: Any, block: FSDPModule, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.block = block
        return keys.view_as(keys), values.view_as(values)

    @staticmethod
    def backward(ctx: Any, keys: torch.Tensor, values: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        ctx.block.unshard()
        return None, keys, values


@contextmanager
def regathered_prompt(model: torch.nn.Module) -> Iterator[None]:
    """Inside it, a sharded learner's forward of shared prompts (``shared_prompt_cache``) can be back-propagated.

    The completions reach each block's prompt pass through that block's cached keys and values, not through the
    block's output, so FSDP2's hooks do not gather the block's weights for it: autograd runs the prompt's nodes
    after the completions' backward has resharded the block. Each block's cached keys and values pass through
    ``_Regather`` right after its forward, whose backward runs just before that block's prompt nodes (autograd
    runs the most recently created ready node first) and gathers the block again; FSDP2's post-backward hook on
    the block's input then reduce-scatters its gradients and reshards it, so one block at a time is gathered, as
    in a plain forward. Nothing changes outside a grad-enabled FSDP2 learner."""
    if not (isinstance(model, FSDPModule) and torch.is_grad_enabled()):
        yield
        return
    index = {block: i for i, block in enumerate(blocks(model))}

    def wrap(block: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        cache = next((value for value in kwargs.values() if isinstance(value, Cache)), None)
        if cache is not None:
            layer = cache.layers[index[block]]
            layer.keys, layer.values = _Regather.apply(block, layer.keys, layer.values)

    hooks = [block.register_forward_hook(wrap, with_kwargs=True) for block in index]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def gather_into(learner: torch.nn.Module, whole: torch.nn.Module) -> None:
    """Copy the sharded ``learner``'s weights into ``whole`` (its unsharded twin) on every rank; every rank calls
    it (each sharded parameter is all-gathered)."""
    target = dict(whole.named_parameters())
    for name, param in learner.named_parameters():
        value = param.full_tensor() if isinstance(param, DTensor) else param
        target[name].copy_(value)


def master_weights(learner: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The learner's whole fp32 weights by name, on the CPU, a tied parameter under its first name only (as the
    model saves itself); every rank calls it, rank 0's holds them."""
    state = get_model_state_dict(learner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied = ({n for n, _ in learner.named_parameters(remove_duplicate=False)}
            - {n for n, _ in learner.named_parameters()})
    return {name: value for name, value in state.items() if name not in tied}


def optimizer_state(learner: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's whole state (every parameter's whole moments), keyed by parameter name, so a run with any
    number of processes loads it; across processes every rank calls it and rank 0's holds it, on the CPU."""
    gathered = dist.is_available() and dist.is_initialized()
    return get_optimizer_state_dict(learner, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=gathered))


def load_optimizer_state(learner: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``optimizer_state``'s whole state into this rank's share of it (every rank, each from the whole state)."""
    set_optimizer_state_dict(learner, optimizer, state, options=StateDictOptions(full_state_dict=True))
