"""Interrupt runs at random points and resume them: every resumed run must log each step once and end
with the uninterrupted run's metrics and weights.

    python bench/interrupts.py --runs 10      # SIGINT or SIGTERM at a random optimiser step of each run

Runs in this process on the tiny model (3 RL steps of 3 mini-batches each); prints one line per run and
exits 1 when a resumed run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from safetensors.torch import load_file

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.training.loop import train

RUN = ["~experiment", "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_hidden_layers=1",
       "model.tiny.num_attention_heads=2", "model.tiny.num_key_value_heads=1", "model.tiny.head_dim=16", "env.size=4",
       "env.eval_size=6", "rollout.tasks_per_step=2", "rollout.max_new_tokens=12", "algorithm.num_generations=3",
       "trainer.learning_rate=1e-3", "logger=none", "progress=false", "trainer.steps=3", "trainer.mini_batch_size=2",
       "trainer.save_every=0", "trainer.eval_every=0"]
"""3 RL steps of 3 mini-batches (6 rows, 2 per mini-batch) on the tiny model, nothing saved but on the way out."""
OPTIMISER_STEPS = 9


def train_config(*overrides: str) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "step_000003" / "policies" / "shared" / "model.safetensors")


def interrupted_run(run: Path, signum: int, at: int) -> None:
    """Train with ``signum`` sent on optimiser step ``at``, then resume to the end."""
    clip, count = torch.nn.utils.clip_grad_norm_, 0

    def clip_and_signal(*args, **kwargs):
        nonlocal count
        count += 1
        if count == at:
            os.kill(os.getpid(), signum)
        return clip(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clip_and_signal
    try:
        train(train_config(*RUN), run)
    except KeyboardInterrupt:
        pass
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    train(train_config(*RUN, f"trainer.resume={run}"), run.parent / "unused")


def close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-7 + 1e-5 * abs(b[k]) if isinstance(b[k], float)
                                        else a[k] == b[k] for k in b)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, failed = random.Random(args.seed), 0
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole"
        train(train_config(*RUN), whole)
        for i in range(args.runs):
            signum, at = rng.choice([signal.SIGINT, signal.SIGTERM]), rng.randint(1, OPTIMISER_STEPS)
            run = Path(tmp) / f"run{i}"
            interrupted_run(run, signum, at)
            mine, ref = metrics(run), metrics(whole)
            same_steps = [m["step"] for m in mine] == [m["step"] for m in ref]
            same_metrics = same_steps and all(close(a, b) for a, b in zip(mine, ref, strict=True))
            w, w0 = weights(run), weights(whole)
            same_weights = all(torch.allclose(w[k], v, rtol=1e-5, atol=1e-7) for k, v in w0.items())
            ok = same_steps and same_metrics and same_weights
            failed += not ok
            print(f"run {i}: {signal.Signals(signum).name} at optimiser step {at} (RL step {(at - 1) // 3 + 1}): "
                  f"steps once {same_steps}, metrics equal {same_metrics}, weights equal {same_weights}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
