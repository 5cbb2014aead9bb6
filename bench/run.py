"""Speed and memory of the training loop's parts on the tiny model; writes bench/report.json.

Measures, on Plan-Path with the embedded run's settings: batched sampling (completions and tokens per
second), one GRPO update of a step's rows, a 200-task greedy evaluation, and the process's peak RSS.
Usage: ``make bench`` (or ``python bench/run.py --out bench/report.json --repeats 3``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from marl_cli.algorithms.grpo import assign_advantages
from marl_cli.config.schema import ModelConfig, PlanPathConfig, TrainerConfig, WorkflowConfig
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.policies.regime import build_policies
from marl_cli.rollout.engine import run_episodes
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.training.loop import evaluate
from marl_cli.training.policy_trainer import PolicyTrainer
from marl_cli.workflows.single_agent import SingleAgentWorkflow


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/report.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    env = PlanPathEnv(PlanPathConfig(size=4))
    workflow = SingleAgentWorkflow(OmegaConf.structured(WorkflowConfig(name="single_agent")), env)
    role_map = {"agent": "shared"}
    with tempfile.TemporaryDirectory() as tmp:
        policies = build_policies(role_map, OmegaConf.structured(ModelConfig()), 0, Path(tmp), torch.device("cpu"))
        trainer_cfg = OmegaConf.structured(TrainerConfig(learning_rate=1e-4, steps=args.repeats, loss_type="bnpo"))
        trainer = PolicyTrainer(policies["shared"], trainer_cfg, 0.7, 32, Path(tmp) / "trl", 0)
        generator = HFGenerator()
        tasks = [env.task("train", i) for i in range(args.tasks)]
        sampling = Sampling(temperature=0.7, max_new_tokens=32)
        rollout_s, result = timed(lambda: run_episodes(workflow, policies, role_map, tasks, args.generations,
                                                       sampling, generator), args.repeats)
        rows = result.samples
        assign_advantages(rows)
        update_s, _ = timed(lambda: trainer.update(rows, random.Random(0)), args.repeats)
        eval_s, _ = timed(lambda: evaluate(workflow, policies, role_map, 200, Sampling(0.0, max_new_tokens=32),
                                           generator), args.repeats)
    tokens = sum(len(s.completion_ids) for s in rows)
    report = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "processor": platform.processor() or platform.machine()},
        "setting": {"env": "plan_path 4x4", "model": "tiny (default TinyModelConfig)", "tasks": args.tasks,
                    "generations": args.generations, "repeats": args.repeats},
        "rollout_s": rollout_s,
        "rollout_completions_per_s": len(rows) / rollout_s,
        "rollout_tokens_per_s": tokens / rollout_s,
        "update_s": update_s,
        "update_rows_per_s": len(rows) / update_s,
        "eval_200_greedy_s": eval_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
