"""The checks of one process's training path: the device itself, a bf16 update with fp32 master weights, gradient
checkpointing, and asynchronous rollouts (``trainer.max_staleness``)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from marl_cli.gpu_check.checks import Figures, Setup, expect
from marl_cli.gpu_check.common import (
    TINY,
    Distance,
    compose_train,
    cuda_peak,
    grpo_rows,
    relative,
    saved_activations,
    tiny_policy,
    trainer,
    weights,
)

MATMUL = 256
"""The matmul the device check runs: 256 × 256, float32, against float64 on the CPU."""


def device(setup: Setup) -> Figures:
    """Versions and the card (name, memory, count, compute capability, bf16), and a float32 matmul on the device
    within float32's rounding bound of float64's (TF32 or a broken device would not be)."""
    figures: Figures = {"torch": torch.__version__}
    if setup.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        figures.update({"cuda": torch.version.cuda, "driver": driver_version(), "gpu": props.name,
                        "memory GiB": round(props.total_memory / 2 ** 30, 1), "count": torch.cuda.device_count(),
                        "capability": f"{props.major}.{props.minor}", "bf16": torch.cuda.is_bf16_supported()})
    else:
        figures.update({"cuda": "not available", "cpus": os.cpu_count()})
    a = torch.randn(MATMUL, MATMUL, generator=torch.Generator().manual_seed(0))
    product = (a.to(setup.place()) @ a.to(setup.place())).cpu().double()
    exact, magnitude = a.double() @ a.double(), a.abs().double() @ a.abs().double()
    ratio = float(((product - exact).abs() / (MATMUL * torch.finfo(torch.float32).eps * magnitude)).max())
    expect(ratio <= 1.0, f"a float32 matmul is off by {ratio:.3g}× float32's rounding bound (TF32 on?)")
    figures["matmul error / bound"] = ratio
    return figures


def driver_version() -> str:
    """The NVIDIA driver's version, as ``nvidia-smi`` reports it."""
    if shutil.which("nvidia-smi") is None:
        return "unknown (no nvidia-smi)"
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def bf16_master(setup: Setup) -> Figures:
    """A tiny policy in ``setup.dtype`` trained with master weights at lr 1e-6: the learner's weights and AdamW's
    state stay fp32, every weight tensor moves (a step of 1e-6 is below bf16's resolution at these magnitudes), the
    loss is finite."""
    policy = tiny_policy(setup, "bf16-master", setup.dtype, master_weights=True)
    learner = trainer(policy, Path(setup.workdir) / "bf16-master", learning_rate=1e-6, mini_batch_size=16)
    before = weights(policy.model)
    stats = learner.update(grpo_rows(0), random.Random(0))
    after = weights(policy.model)
    masters = {str(p.dtype) for p in learner.learner.parameters()}
    state = {str(v.dtype) for s in learner.optimizer.state.values() for v in s.values()
             if torch.is_tensor(v) and v.dim() > 0}
    expect(masters == {"torch.float32"}, f"the master weights are {masters}, not float32")
    expect(state == {"torch.float32"}, f"AdamW's state is {state}, not float32")
    expect(policy.model.device.type == setup.device, f"the policy is on {policy.model.device}, not {setup.device}")
    expect(math.isfinite(stats["loss"]), f"the loss is {stats['loss']}")
    still = [name for name in before if torch.equal(before[name], after[name])]
    expect(not still, f"{len(still)} weight tensors did not move at lr 1e-6 (e.g. {still[:1]})")
    moved = torch.cat([(after[k] != before[k]).flatten() for k in before])
    in_bf16 = torch.cat([(after[k].bfloat16() != before[k].bfloat16()).flatten() for k in before])
    return {"compute": str(policy.autocast_dtype or policy.compute_dtype).removeprefix("torch."),
            "masters": "float32", "loss": stats["loss"], "grad norm": stats["grad_norm"],
            "weights moved": float(moved.float().mean()), "moved in a bf16 copy": float(in_bf16.float().mean())}


def recompute_tolerance(dtype: torch.dtype, layers: int) -> float:
    """How far (relative) the loss, gradient norm and update may differ with checkpointing. The recomputed forward
    runs the same kernels on the same inputs, so it is exact unless a kernel reorders its float32 accumulation
    between calls (atomics); a reordering may round each layer's output in the compute dtype the other way: one
    unit of ``dtype``'s rounding per layer and one for the head."""
    return (layers + 1) * torch.finfo(dtype).eps


def gradient_checkpointing(setup: Setup) -> Figures:
    """The same bf16 update with and without ``trainer.gradient_checkpointing``: loss, gradient norm and weights
    equal within ``recompute_tolerance``; fewer activations saved for the backward, and (CUDA) a lower peak."""
    plain, checkpointed = (_checkpointing_run(setup, flag) for flag in (False, True))
    tolerance = recompute_tolerance(getattr(torch, setup.dtype), TINY.num_hidden_layers)
    loss_gap = relative(checkpointed["stats"]["loss"], plain["stats"]["loss"])
    norm_gap = relative(checkpointed["stats"]["grad_norm"], plain["stats"]["grad_norm"])
    distance = Distance.between(plain["end"], checkpointed["end"], plain["start"])
    expect(loss_gap <= tolerance, f"the loss differs by {loss_gap:.3g} (relative; tolerance {tolerance:.3g})")
    expect(norm_gap <= tolerance, f"the gradient norm differs by {norm_gap:.3g} (tolerance {tolerance:.3g})")
    expect(distance.mean_ratio <= tolerance,
           f"the weights differ by {distance.mean_ratio:.3g} of the update on average (tolerance {tolerance:.3g})")
    expect(checkpointed["saved"] < plain["saved"],
           f"checkpointing saved {checkpointed['saved']} bytes of activations, without {plain['saved']}")
    figures: Figures = {"loss gap": loss_gap, "grad norm gap": norm_gap, "weights gap": distance.mean_ratio,
                        "tolerance": tolerance, "saved MiB": f"{plain['saved'] / 2**20:.2f} → "
                                                            f"{checkpointed['saved'] / 2**20:.2f}"}
    if plain["peak"] is not None:
        expect(checkpointed["peak"] < plain["peak"],
               f"the peak rose with checkpointing: {plain['peak']:.1f} → {checkpointed['peak']:.1f} MiB")
        figures["peak MiB"] = f"{plain['peak']:.1f} → {checkpointed['peak']:.1f}"
    return figures


def _checkpointing_run(setup: Setup, checkpointing: bool) -> dict[str, Any]:
    """One update of long rows (one mini-batch), with or without checkpointing: the weights before and after, the
    update's statistics, the bytes of activations saved and the peak memory."""
    name = f"checkpointing-{checkpointing}"
    policy = tiny_policy(setup, name, setup.dtype, master_weights=True)
    learner = trainer(policy, Path(setup.workdir) / name, gradient_checkpointing=checkpointing, mini_batch_size=16)
    expect(policy.model.is_gradient_checkpointing == checkpointing, "trainer.gradient_checkpointing is not applied")
    start = weights(policy.model)
    rows = grpo_rows(1, prompt=(96, 128), completion=(96, 160))
    with saved_activations() as saved, cuda_peak(setup.place()) as peak:
        stats = learner.update(rows, random.Random(0))
    return {"start": start, "end": weights(policy.model), "stats": stats, "saved": saved[0], "peak": peak[0]}


def async_rollouts(setup: Setup) -> Figures:
    """``trainer.max_staleness``: four steps of a tiny run synchronous (k=0) and with a rollout worker one update
    behind (k=1) on the device, both completing with the staleness the schedule gives; the learner's seconds per
    step after the first (the worker's start is not in them) of each, and their ratio."""
    walls = {}
    for k in (0, 1):
        short_run(setup, f"staleness-{k}", f"trainer.max_staleness={k}", steps=4)
        steps = [json.loads(line) for line in (Path(setup.workdir) / f"staleness-{k}" / "metrics.jsonl").open()]
        steps = [r for r in steps if "time/step_s" in r]
        ages = [r["async/staleness_max"] for r in steps]
        expect(ages == [min(k, s) for s in range(4)], f"k={k}: rows {ages} updates old, not {[0] + [k] * 3}")
        walls[k] = sum(r["time/step_s"] for r in steps[1:]) / 3
    return {"s/step k=0": walls[0], "s/step k=1": walls[1], "ratio": walls[1] / walls[0]}


def short_run(setup: Setup, name: str, *overrides: str, steps: int = 2) -> float:
    """``marl train`` of the tiny model for ``steps`` steps on the setup's device with ``overrides``; its wall
    seconds per step (the run must complete)."""
    from marl_cli.training.loop import train

    cfg = compose_train("~experiment", "env.size=4", "env.eval_size=4", "rollout.tasks_per_step=2",
                        "rollout.max_new_tokens=12", "algorithm.num_generations=2", "logger=none", "progress=false",
                        f"trainer.steps={steps}", f"device={setup.place()}", *overrides)
    start = time.perf_counter()
    summary = train(cfg, Path(setup.workdir) / name)
    expect(summary.get("status") == "completed", f"the run ended {summary.get('status')!r}")
    return (time.perf_counter() - start) / steps
