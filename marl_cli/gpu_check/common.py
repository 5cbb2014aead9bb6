"""What the checks share: the tiny policy and its trainer on a ``Setup``'s device, GRPO-shaped rows, weights and how
far two sets of them are apart, and the memory a block of code took (the activations autograd saved; the CUDA peak
where there is one)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from marl_cli.config.schema import ModelConfig, TinyModelConfig, TrainerConfig
from marl_cli.core.samples import Sample
from marl_cli.core.world import World
from marl_cli.policies.regime import Policy, build_policies
from marl_cli.training.learner.policy_trainer import PolicyTrainer

TINY = TinyModelConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=64, max_position_embeddings=512)
"""The checks' model: 2 heads of 64 (vLLM's GPU attention kernels take head sizes of 32 and up; 2 heads split over
2 GPUs under tensor parallelism), ~0.4 M parameters."""
MIB = 2 ** 20


def tiny_policy(setup: Any, name: str, dtype: str = "float32", master_weights: bool = False,
                tiny: TinyModelConfig = TINY, rank: int = 0) -> Policy:
    """The tiny policy (seed 0: the same weights every call) on process ``rank``'s device, saved under the
    check's own ``name`` in the setup's workdir (a vLLM engine loads it from there)."""
    model_cfg = OmegaConf.structured(ModelConfig(tiny=tiny, dtype=dtype))
    return build_policies({"agent": "shared"}, model_cfg, 0, Path(setup.workdir) / name,
                          torch.device(setup.place(rank)), master_weights=master_weights)["shared"]


def trainer(policy: Policy, workdir: Path, world: World | None = None, **settings: Any) -> PolicyTrainer:
    """A ``PolicyTrainer`` for ``policy`` with the default ``trainer`` config changed by ``settings``."""
    cfg = OmegaConf.structured(TrainerConfig(**{"learning_rate": 1e-3, "steps": 4, **settings}))
    return PolicyTrainer(policy, cfg, 1.0, 64, workdir / "trl", 0, world)


def grpo_rows(seed: int, tasks: int = 4, group: int = 4, prompt: tuple[int, int] = (20, 40),
              completion: tuple[int, int] = (8, 24), vocab: int = 90) -> list[Sample]:
    """``tasks`` groups of ``group`` rows, each group one prompt (as GRPO samples them: the update runs a shared
    prompt once) with random completions and advantages of either sign; token ids below ``vocab``."""
    gen = random.Random(seed)

    def tokens(lengths: tuple[int, int]) -> list[int]:
        return [gen.randrange(3, vocab) for _ in range(gen.randint(*lengths))]

    rows = []
    for task in range(tasks):
        shared = tokens(prompt)
        rows += [Sample(task=task, branch=b, turn=0, role="agent", policy="shared", prompt_ids=shared,
                        completion_ids=tokens(completion), reward=0.0, advantage=gen.choice([-1.0, 1.0]) * (b + 1))
                 for b in range(group)]
    return rows


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A float32 copy of ``model``'s parameters on the CPU, by name."""
    return {name: p.detach().float().cpu().clone() for name, p in model.named_parameters()}


@dataclass(frozen=True)
class Distance:
    """How far weights ``b`` are from ``a``, against the update ``a`` took from ``start``: the largest difference,
    and the mean difference over the mean update (the fraction of the update they disagree on, on average)."""

    max_abs: float
    mean_ratio: float

    @classmethod
    def between(cls, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                start: dict[str, torch.Tensor]) -> Distance:
        diff = torch.cat([(b[k] - a[k]).abs().flatten() for k in a])
        update = torch.cat([(a[k] - start[k]).abs().flatten() for k in a])
        return cls(float(diff.max()), float(diff.mean() / update.mean().clamp(min=1e-30)))


@contextlib.contextmanager
def saved_activations() -> Iterator[list[int]]:
    """Inside it, the bytes of every tensor autograd saves for the backward pass add up in the yielded list's one
    item (gradient checkpointing saves a layer's inputs only: its own hooks keep the rest from being saved)."""
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield total


@contextlib.contextmanager
def cuda_peak(device: str) -> Iterator[list[float | None]]:
    """Inside it, on CUDA, the peak memory allocated above what was allocated on entry, in MiB, lands in the yielded
    list's one item when the block ends (None on the CPU: torch does not track its peak there)."""
    out: list[float | None] = [None]
    if not device.startswith("cuda"):
        yield out
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    yield out
    torch.cuda.synchronize(device)
    out[0] = (torch.cuda.max_memory_allocated(device) - base) / MIB


def relative(a: float, b: float) -> float:
    """|a − b| relative to |b|."""
    return abs(a - b) / max(abs(b), 1e-30)


def compose_train(*overrides: str) -> Any:
    """``conf/train.yaml`` composed with ``overrides``, as ``marl train`` composes it (nothing is loaded)."""
    from hydra import compose, initialize_config_dir

    from marl_cli.config.paths import config_dir
    from marl_cli.plugins import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))
