"""Speed and memory of the training loop's parts on the tiny model; writes bench/report.json.

Measures, with each experiment's composed settings (the embedded single-agent run, the toy AT-GRPO
tree run and the toy M-GRPO run by default): batched sampling of one step (completions and tokens per
second, generate calls), the per-policy update of that step's rows, the greedy evaluation, sandbox
throughput when the run executes code, the SQLite store's write/read/acknowledge throughput for
sub-trajectory-sized items, and the process's peak RSS.
Usage: ``make bench`` (or ``python bench/run.py --experiment embedded --out bench/report.json``).
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
from hydra import compose, initialize_config_dir

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import register_configs
from marl_cli.rollout.engine import run_episodes
from marl_cli.store import SQLiteStore
from marl_cli.training.build import build_run
from marl_cli.training.evaluation import evaluate
from marl_cli.training.policy_trainer import PolicyTrainer


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def measure(experiment: str, repeats: int) -> dict[str, object]:
    """The timings of one step's rollout, update and evaluation under ``experiment``'s settings."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
    report: dict[str, object] = {"tasks": cfg.rollout.tasks_per_step, "generations": cfg.algorithm.num_generations,
                                 "mode": cfg.algorithm.mode, "regime": cfg.policy.name,
                                 "eval_tasks": cfg.env.eval_size}
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(cfg, Path(tmp))
        workflow, role_map, generator = run.workflow, run.role_map, run.generator
        env, sandbox = workflow.env, workflow.env.sandbox
        if run.adapters_pending:
            run.attach_adapters()
        policies = run.policies
        trainers = {name: PolicyTrainer(policy, cfg.trainer, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                        Path(tmp) / "trl" / name, cfg.seed) for name, policy in policies.items()}
        tasks = [env.task("train", i) for i in range(cfg.rollout.tasks_per_step)]
        sampling = run.train_sampling
        rollout_s, result = timed(lambda: run_episodes(workflow, policies, role_map, tasks,
                                                       cfg.algorithm.num_generations, sampling, generator,
                                                       cfg.algorithm.mode, cfg.algorithm.selection,
                                                       random.Random(0)), repeats)
        rows, _ = ALGORITHMS.get(cfg.algorithm.name).advantages(result.samples, cfg.algorithm, random.Random(0), None)
        update_s, _ = timed(lambda: [t.update([r for r in rows if r.policy == n], random.Random(0))
                                     for n, t in trainers.items()], repeats)
        eval_s, _ = timed(lambda: evaluate(run), repeats)
    tokens = sum(len(s.completion_ids) for s in rows)
    report.update({
        "rollout_s": rollout_s,
        "rollout_rows": len(rows),
        "rollout_generate_calls": result.generate_calls,
        "rollout_completions_per_s": len(rows) / rollout_s,
        "rollout_tokens_per_s": tokens / rollout_s,
        "update_s": update_s,
        "update_rows_per_s": len(rows) / update_s,
        "eval_greedy_s": eval_s,
    })
    if sandbox is not None:
        jobs = [("print('D D R R')", "")] * 64
        sandbox_s, _ = timed(lambda: sandbox.run_many(jobs), repeats)
        report["sandbox_runs_per_s"] = len(jobs) / sandbox_s
    return report


def measure_store(items: int, repeats: int) -> dict[str, float]:
    """SQLite store throughput: ``items`` sub-trajectory-sized items written in one transaction, read, acknowledged."""
    row = {"prompt_ids": list(range(400)), "completion_ids": list(range(30)), "reward": 0.5, "info": {"expert": 1.0}}
    batch = {f"1/{i}/0/sub/0": {"rows": [row] * 3} for i in range(items)}
    times: dict[str, list[float]] = {"write": [], "read": [], "ack": []}
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            store = SQLiteStore(str(Path(tmp) / "store.sqlite"), f"bench{r}")
            calls = {"write": lambda s=store: s.put_many("s", batch, ("step/1", {"items": items})),
                     "read": lambda s=store: s.read("s", "sub"),
                     "ack": lambda s=store: s.ack("s", "sub", list(batch))}
            for name, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            store.close()
    return {f"store_sqlite_{k}_items_per_s": items / statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/report.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--experiment", action="append", help="an experiment whose settings are measured "
                        "(repeatable; default: embedded, toy/plan_path_at_grpo_shared, toy/research_mgrpo)")
    args = parser.parse_args()
    register_configs()
    experiments = args.experiment or ["embedded", "toy/plan_path_at_grpo_shared", "toy/research_mgrpo"]
    report = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "processor": platform.processor() or platform.machine()},
        "repeats": args.repeats,
        "experiments": {name: measure(name, args.repeats) for name in experiments},
        "store": measure_store(512, args.repeats),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
