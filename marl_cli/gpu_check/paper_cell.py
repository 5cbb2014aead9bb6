"""One update of a paper cell at its real model shape, with random weights, and its peak memory against the docs'
arithmetic (``docs/guides/rollout-and-gpus.md``, "Memory per paper cell").

The cell is the AT-GRPO Qwen3-1.7B Plan-Path one (``CELL``): its trainer settings come from its config, its model
(``model.name_or_path=Qwen/Qwen3-1.7B``) would come from the hub, so the shape is written here (``QWEN3_1_7B``: the
hub's ``config.json`` values) and the weights are drawn at random: nothing downloads.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from marl_cli.gpu_check.checks import Figures, Setup, Skip, expect
from marl_cli.gpu_check.common import MIB, compose_train, cuda_peak, grpo_rows
from marl_cli.policies.loading import DTYPES
from marl_cli.policies.regime import Policy
from marl_cli.policies.tiny import build_tiny_tokenizer
from marl_cli.training.learner.policy_trainer import PolicyTrainer

CELL = "paper/at_grpo/qwen3_1_7b/plan_path/at_grpo_shared"
QWEN3_1_7B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}
"""Qwen/Qwen3-1.7B's shape, from its ``config.json`` on the hub (1.72 B parameters, the head tied to the
embeddings)."""
TRAINED_BYTES = 16
"""Bytes per parameter of a trained full-model policy: fp32 master weights, fp32 gradients, AdamW's two moments."""
COMPUTE_BYTES = 2
"""Bytes per parameter of a whole bf16 copy (a vLLM engine's; under FSDP2 the policy's own, for rollouts)."""
PEAK_BAND = (0.95, 1.35)
"""Measured peak over the estimate that passes. At the optimiser step every counted byte is held (below 0.95 the
arithmetic counts what the step does not hold); above it come autocast's bf16 weight copies (2/16), an optimiser's
temporaries (up to 2/16) and the activations of the check's 4 rows (under 0.1 at this shape)."""
GB = 10 ** 9
"""The docs' unit of memory (decimal gigabytes)."""
ROWS = {"tasks": 1, "group": 4, "prompt": (256, 256), "completion": (128, 128)}
"""The check's rows: one group of 4 completions of 128 tokens after one 256-token prompt."""


def docs_estimate(params: int, processes: int = 1, sharded: bool = False, engine: bool = False) -> int:
    """The docs' bytes per process for one trained full-model policy of ``params`` parameters: 16 per parameter,
    or sharded over ``processes`` (FSDP2) 2 + 16/n (a whole bf16 copy, 1/n of the learner); plus a vLLM engine's
    bf16 copy (2) with ``engine``. The KV cache and the activations are not counted (nor in the docs)."""
    per_param = COMPUTE_BYTES + TRAINED_BYTES / processes if sharded and processes > 1 else TRAINED_BYTES
    return int(params * (per_param + (COMPUTE_BYTES if engine else 0)))


def random_policy(shape: dict[str, Any], compute: torch.dtype, device: str) -> Policy:
    """A Qwen3 policy of ``shape`` with random fp32 weights (the masters) built on ``device``, computing in
    ``compute``, with the tiny tokenizer (the update reads its pad id only)."""
    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return Policy("shared", model, tokenizer, f"random weights of the {CELL} shape", roles=["agent"],
                  compute_dtype=compute)


def free_memory(device: str) -> int:
    """Bytes free for the check: on CUDA the device's free memory, on the CPU what Linux says is available."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    lines = meminfo.read_text().splitlines() if meminfo.exists() else []
    kib = next((int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")), 0)
    return kib * 1024


def paper_cell(setup: Setup, shape: dict[str, Any] | None = None) -> Figures:
    """One update of ``CELL``'s trainer (its loss, learning rate, clip, bf16 with fp32 masters) at ``shape``
    (default ``QWEN3_1_7B``): the loss is finite, the weights move, and on CUDA the peak memory allocated lies in
    ``PEAK_BAND`` times ``docs_estimate``. A skip where the estimate does not fit in the memory free."""
    shape = shape or QWEN3_1_7B
    with torch.device("meta"):  # the shape alone: no memory
        params = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**shape)).parameters())
    estimate = docs_estimate(params)
    room = free_memory(setup.place())
    if estimate * PEAK_BAND[1] > room:
        raise Skip(f"the cell needs about {estimate / GB:.1f} GB by the docs' arithmetic; {setup.place()} has "
                   f"{room / GB:.1f} GB free")
    cfg = compose_train(f"experiment={CELL}")
    compute = DTYPES[cfg.model.dtype] if setup.dtype == "bfloat16" else DTYPES[setup.dtype]
    rows = grpo_rows(0, vocab=shape["vocab_size"], **ROWS)
    with cuda_peak(setup.place()) as peak:
        policy = random_policy(shape, compute, setup.place())
        probe = policy.model.model.layers[-1].mlp.down_proj.weight
        before = probe.detach().clone()
        learner = PolicyTrainer(policy, cfg.trainer, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                Path(setup.workdir) / "paper-cell", cfg.seed)
        stats = learner.update(rows, random.Random(0))
    expect(math.isfinite(stats["loss"]), f"the loss is {stats['loss']}")
    expect(not torch.equal(before, probe.detach()), f"the last layer's weights did not move at lr "
                                                    f"{cfg.trainer.learning_rate}")
    figures: Figures = {"params B": params / 1e9, "compute": str(compute).removeprefix("torch."),
                        "lr": cfg.trainer.learning_rate, "loss": stats["loss"], "estimate GB": estimate / GB}
    if peak[0] is not None:
        ratio = peak[0] * MIB / estimate
        expect(PEAK_BAND[0] <= ratio <= PEAK_BAND[1], f"the peak is {ratio:.3g}× the docs' estimate "
                                                      f"(band {PEAK_BAND[0]}–{PEAK_BAND[1]})")
        figures.update({"peak GB": peak[0] * MIB / GB, "peak / estimate": ratio})
    return figures
