"""The speed checks: marl against raw TRL per step at equal work (``pair.py``) at a model shape, then the 3-turn
embedded run's seconds per step synchronous (k=0) and with rollouts one update behind (k=1, ``trainer.max_staleness``),
with each side's peak memory on CUDA, and marl's step with ``rollout.hf.cache=static`` (its decoding compiled on
CUDA).

The shapes are Qwen3-0.6B's and Qwen3-1.7B's layers (the hub's ``config.json`` values) with random weights and the
tiny model's character vocabulary (nothing downloads; the head is small, so the step is the layers'). On CUDA a step
holds 16 prompts × 8 completions of 64 tokens in bf16 over fp32 masters; the CPU stand-in (``speed-tiny``) runs the
tiny model at ``make bench-trl``'s work in float32.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from marl_cli.gpu_check.checks import Figures, Setup, Skip, expect
from marl_cli.gpu_check.common import cuda_peak
from marl_cli.gpu_check.pair import (
    Work,
    compare,
    embedded_config,
    marl_config,
    model_dir,
    run_marl,
    shape_overrides,
    step_records,
)
from marl_cli.gpu_check.paper_cell import QWEN3_1_7B

LAYERS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim")
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {},
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128},
    "1.7b": {key: QWEN3_1_7B[key] for key in LAYERS},
}
"""The layers of each shape (``model.tiny.*``); ``tiny``: the tiny model's own."""
GPU_WORK = Work(tasks=16, generations=8, tokens=64, steps=3)
CPU_WORK = Work(steps=3)


def speed_tiny(setup: Setup) -> Figures:
    """The tiny model (on the CPU: the stand-in of the shapes below)."""
    return speed(setup, "tiny")


def speed_0_6b(setup: Setup) -> Figures:
    """Qwen3-0.6B's layers (CUDA only)."""
    return speed(setup, "0.6b")


def speed_1_7b(setup: Setup) -> Figures:
    """Qwen3-1.7B's layers (CUDA only)."""
    return speed(setup, "1.7b")


def speed(setup: Setup, shape: str, work: Work | None = None) -> Figures:
    """marl's and raw TRL's seconds per step at equal ``work`` (default: ``GPU_WORK`` on CUDA, ``CPU_WORK`` on the
    CPU) with the model's layers at ``shape``, their ratios and peaks; the 3-turn embedded run's seconds per step at
    k=0 and k=1 (each run must complete, its completions as long as the work says). On the CPU one thread, as
    ``make bench-trl``."""
    cuda = setup.device == "cuda"
    if shape != "tiny" and not cuda:
        raise Skip(f"the {shape} shape takes minutes a step on the CPU; speed-tiny is its stand-in")
    work = work or (GPU_WORK if cuda else CPU_WORK)
    if not cuda:
        torch.set_num_threads(1)  # both sides: TRL's trainer takes torch's default
    overrides = [*shape_overrides(SHAPES[shape]), f"device={setup.place()}",
                 f"model.dtype={'bfloat16' if cuda else 'float32'}"] + ([] if cuda else ["threads=1"])
    root = Path(setup.workdir) / f"speed-{shape}"
    report = compare(work, overrides, 1, root)
    figures: Figures = {"work": f"{work.tasks}×{work.generations}×{work.tokens}",
                        "marl s/step": report["marl"]["step_s"], "TRL s/step": report["trl"]["step_s"],
                        "ratio": report["marl_vs_trl"]["step_s"], "rollout ratio": report["marl_vs_trl"]["rollout_s"],
                        "update ratio": report["marl_vs_trl"]["update_s"]}
    if "peak_mib" in report["marl"]:
        figures.update({"marl peak GiB": report["marl"]["peak_mib"] / 1024,
                        "TRL peak GiB": report["trl"]["peak_mib"] / 1024})
    # transformers compiles the static cache's decoding step on CUDA only: on the CPU it is the uncompiled path
    cfg = marl_config(work, *overrides, "rollout.hf.cache=static", f"model.name_or_path={model_dir(root)}")
    static = run_marl(cfg, root / "marl_static", work)
    figures["marl static-cache s/step"] = statistics.median(s["rollout_s"] + s["update_s"] for s in static)
    for k in (0, 1):
        seconds, peak = embedded_step(overrides, k, work, root / f"embedded-k{k}")
        figures[f"3-turn s/step k={k}"] = seconds
        if peak is not None:
            figures[f"3-turn peak GiB k={k}"] = peak / 1024
    return figures


def embedded_step(overrides: list[str], staleness: int, work: Work, run: Path) -> tuple[float, float | None]:
    """``experiment=embedded`` (3 turns) without its warm start at ``work``'s tasks, group and completion length,
    for ``work.steps`` steps with rollouts ``staleness`` updates behind: its median seconds per step after the first,
    and its peak memory (MiB, CUDA)."""
    from marl_cli.training.loop import train

    cfg = embedded_config(work, f"trainer.max_staleness={staleness}", *overrides)
    with cuda_peak(str(cfg.device)) as peak:
        summary = train(cfg, run)
    expect(summary.get("status") == "completed", f"the 3-turn run (k={staleness}) ended {summary.get('status')!r}")
    return statistics.median(r["time/step_s"] for r in step_records(run)[1:]), peak[0]
