"""Speed and memory of the training loop's parts on the tiny model; writes bench/report.json.

Measures, with each experiment's composed settings (the embedded single-agent run, the toy AT-GRPO
tree run and the toy M-GRPO run by default): batched sampling of one step (completions and tokens per
second, generate calls), the per-policy update of that step's rows (and the same update with its
zero-advantage rows back-propagated too), both again with every row running its own prompt (no prompt
sharing; the sampling then decodes into generate's own key/value cache), the greedy evaluation, sandbox
throughput when the run executes code, the SQLite store's write/read/acknowledge throughput for
sub-trajectory-sized items, the learning half of a step for each value-model method against AT-GRPO's (critic
scoring, advantages, policy and critic updates on one shared rollout), the toy Plan-Path AT-GRPO run's wall per
step synchronous and with asynchronous rollouts (``trainer.max_staleness`` 1 and 2), and the process's peak RSS.
``--backends`` (``make bench-vllm``, in the vLLM venv) compares the rollout backends instead: vLLM against HF
``generate`` on the same prompts (a step's groups: 16 prompts × 8 samples), for the tiny model and a
Qwen2.5-0.5B-shaped one, in completion tokens per second. ``--only-async``: the asynchronous rollouts' comparison
alone; ``--only-values``: the value methods' learning halves alone. marl against raw TRL at equal work is
``bench/trl_pair.py`` (``make bench-trl``).
Usage: ``make bench`` (or ``python bench/run.py --experiment embedded --out bench/report.json``)."""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import resource
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.store import SQLiteStore
from marl_cli.training.build import build_run
from marl_cli.training.evaluation import evaluate
from marl_cli.training.learner.policy_trainer import PolicyTrainer


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def learners(run: Any, workdir: Path) -> tuple[dict[str, PolicyTrainer], dict[str, PolicyTrainer]]:
    """Each policy's learner as training builds it, and one that back-propagates every row
    (``trainer.skip_zero_advantage=false``); the loss temperature is the one rollouts sample at (``run.sampling``)."""
    cfg, sampling = run.cfg, run.sampling
    full = OmegaConf.merge(cfg.trainer, {"skip_zero_advantage": False})
    built = tuple({name: PolicyTrainer(policy, trainer_cfg, sampling.temperature, sampling.max_new_tokens,
                                       workdir / "trl" / name, cfg.seed) for name, policy in run.policies.items()}
                  for trainer_cfg in (cfg.trainer, full))
    return built[0], built[1]


def measure(experiment: str, repeats: int) -> dict[str, object]:
    """The timings of one step's rollout, update and evaluation under ``experiment``'s settings."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
    report: dict[str, object] = {"tasks": cfg.rollout.tasks_per_step, "generations": cfg.algorithm.num_generations,
                                 "mode": cfg.algorithm.mode, "regime": cfg.policy.name,
                                 "eval_tasks": cfg.env.eval_size}
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(cfg, Path(tmp))
        env, sandbox = run.workflow.env, run.workflow.env.sandbox
        if run.adapters_pending:
            run.attach_adapters()
        trainers, full_trainers = learners(run, Path(tmp))
        tasks = [env.task("train", i) for i in range(cfg.rollout.tasks_per_step)]
        def rollout() -> object:
            return run.rollout.play(tasks, cfg.algorithm.num_generations, random.Random(0))

        rollout_s, result = timed(rollout, repeats)
        rows, _ = ALGORITHMS.get(cfg.algorithm.name).advantages(result.samples, cfg.algorithm, random.Random(0), None)

        def update(by_name: dict[str, PolicyTrainer] = trainers) -> list[dict[str, float]]:
            return [t.update([r for r in rows if r.policy == n], random.Random(0)) for n, t in by_name.items()]

        update_s, stats = timed(update, repeats)
        with mock.patch("marl_cli.rollout.generation.shared_prompt_cache", return_value=None), \
                mock.patch("marl_cli.training.learner.trl_adapter.shared_prompt_forward", return_value=None):
            rollout_unshared_s, _ = timed(rollout, repeats)
            update_unshared_s, _ = timed(update, repeats)
        update_full_s, _ = timed(lambda: update(full_trainers), repeats)
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
        "update_trained_row_fraction": statistics.mean(s.get("trained_row_fraction", 0.0) for s in stats),
        "update_every_row_s": update_full_s,  # trainer.skip_zero_advantage=false: zero-advantage rows back-propagated
        "rollout_unshared_prompts_s": rollout_unshared_s,  # generate's own prefill (each row's prompt) and cache
        "update_unshared_prompts_s": update_unshared_s,  # each row's prompt scored and trained on its own
        "eval_greedy_s": eval_s,
    })
    if sandbox is not None:
        jobs = [("print('D D R R')", "")] * 64
        report["sandbox_runs_per_s"] = len(jobs) / timed(lambda: sandbox.run_many(jobs), repeats)[0]
    return report


SHAPES = {
    "tiny": ([], (64, 512)),
    "qwen2.5-0.5b-shaped": (["model.tiny.hidden_size=896", "model.tiny.intermediate_size=4864",
                             "model.tiny.num_hidden_layers=24", "model.tiny.num_attention_heads=14",
                             "model.tiny.num_key_value_heads=2", "model.tiny.head_dim=64"], (64,)),
}
"""Model shapes the backend comparison runs (random weights; the tiny character tokenizer's vocabulary), each
with the completion lengths it is measured at (the backends differ in decoding, so the tiny shape runs a long
completion too; the 0.5B shape's HF side takes minutes a call already at 64)."""


def cold_generate(vllm: Any, generator: Any, policy: Any, texts: list[str], sampling: Sampling) -> list:
    """``generator``'s completions of ``texts`` with every vLLM engine's prefix cache emptied first."""
    for engine in vllm.engines.values():
        engine.reset_prefix_cache()
    return generator.generate(policy, texts, sampling)


def measure_backends(repeats: int, overrides: list[str], tasks: int = 16, group: int = 8,
                     shapes: list[str] | None = None, new_tokens: list[int] | None = None) -> dict[str, object]:
    """Completion tokens per second of ``rollout=vllm`` and ``rollout=hf`` on the same prompts, per model shape and
    completion length: ``tasks`` prompts sampled ``group`` times each, as one training step's groups are. Every
    vLLM call starts from an empty prefix cache, so no call reuses a prompt an earlier repeat prefilled.
    ``shapes`` and ``new_tokens`` narrow the run to some shapes and completion lengths."""
    report: dict[str, object] = {"prompts": tasks, "samples_per_prompt": group, "temperature": 1.0,
                                 "overrides": overrides}
    for shape in shapes or SHAPES:
        shape_overrides, lengths = SHAPES[shape]
        lengths = new_tokens or lengths
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[*shape_overrides, "rollout=vllm", "workflow=tool_plan",
                                                          "algorithm=at_grpo", "logger=none",
                                                          f"rollout.max_new_tokens={max(lengths)}", *overrides])
        with tempfile.TemporaryDirectory() as tmp:
            run = build_run(cfg, Path(tmp))
            policy, vllm, hf = run.policies["shared"], run.generator, HFGenerator()
            states = [run.workflow.initial_state(run.workflow.env.task("train", i)) for i in range(tasks)]
            texts = [run.workflow.prompt("plan", s) for s in states for _ in range(group)]
            t0 = time.perf_counter()
            vllm.engine(policy)  # started and holding the policy's weights: the timed calls only generate
            result: dict[str, object] = {"engine_start_s": time.perf_counter() - t0}
            for length in lengths:
                sampling = Sampling(1.0, max_new_tokens=length)
                cell: dict[str, float] = {}
                for name, generator in (("vllm", vllm), ("hf", hf)):
                    seconds, gens = timed(partial(cold_generate, vllm, generator, policy, texts, sampling), repeats)
                    cell[f"{name}_s"] = seconds
                    cell[f"{name}_tokens_per_s"] = sum(len(g.completion_ids) for g in gens) / seconds
                cell["vllm_over_hf"] = cell["vllm_tokens_per_s"] / cell["hf_tokens_per_s"]
                result[f"new_tokens_{length}"] = cell
            result["torch_threads"] = torch.get_num_threads()  # HF's, after the engine started
            report[shape] = result
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


VALUE_METHODS: dict[str, tuple[str, ...]] = {
    "plan_path_at_grpo": ("experiment=toy/values/plan_path_at_grpo",),
    "at_grpo_every_row": ("experiment=toy/values/plan_path_at_grpo", "trainer.skip_zero_advantage=false"),
    "plan_path_ppo": ("experiment=toy/values/plan_path_ppo",),
    "plan_path_archer": ("experiment=toy/values/plan_path_archer",),
    "plan_path_marft_team": ("experiment=toy/values/plan_path_marft_team",)}
"""The value-model table's rows (name: overrides): AT-GRPO, AT-GRPO back-propagating every row as the critics'
policies do (their advantages are seldom zero), and the three critics, on the same budget."""


def measure_values(repeats: int) -> dict[str, dict[str, float]]:
    """Per value-model row, the learning half of a step on one shared rollout (the rows of AT-GRPO's budget, tiny
    untrained model, warm start off): the critic's scoring, the estimator, the policy update and the critic's
    update, in seconds and relative to AT-GRPO's (whose step is the estimator and the update) and to AT-GRPO's
    back-propagating every row."""
    out: dict[str, dict[str, float]] = {}
    samples = None
    for name, overrides in VALUE_METHODS.items():
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[*overrides, "trainer.warmstart.enabled=false"])
        with tempfile.TemporaryDirectory() as tmp:
            run = build_run(cfg, Path(tmp))
            if samples is None:  # one rollout for every row: the methods differ in what they learn from it
                rollout_s, samples = _one_rollout(cfg, run)
            out[name] = _learn_timings(cfg, run, samples, Path(tmp), repeats)
    base, every_row = out["plan_path_at_grpo"]["learn_s"], out["at_grpo_every_row"]["learn_s"]
    for timings in out.values():
        timings["rollout_s"] = rollout_s
        timings["learn_vs_at_grpo"] = timings["learn_s"] / base
        timings["learn_vs_at_grpo_every_row"] = timings["learn_s"] / every_row
        timings["step_vs_at_grpo"] = (rollout_s + timings["learn_s"]) / (rollout_s + base)
    return out

ASYNC = {"sync, 2 threads": (0, 2), "sync, 1 thread": (0, 1), "max_staleness=1": (1, 1), "max_staleness=2": (2, 1)}
"""The wall-per-step comparison: (``trainer.max_staleness``, threads of each process)."""


def measure_async(steps: int = 6) -> dict[str, dict[str, float]]:
    """The toy table's Plan-Path AT-GRPO run, ``steps`` steps from one (cached) warm start: the learner's seconds
    per step after the first (rollout, or waiting for the worker's rows, then the update) synchronous and with a
    rollout worker ``max_staleness`` updates behind; the worker and the learner get one thread each, the
    synchronous run both (and one, for reference)."""
    from marl_cli.training.loop import train

    out: dict[str, dict[str, float]] = {}
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (k, n) in ASYNC.items():
            with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
                cfg = compose(config_name="train", overrides=[
                    "experiment=toy/table/plan_path_at_grpo_shared", f"trainer.steps={steps}", "env.eval_size=8",
                    f"trainer.max_staleness={k}", f"threads={n}", "progress=false",
                    f"trainer.warmstart.cache={tmp}/cache"])
            torch.set_num_threads(n)
            run = Path(tmp) / name.replace(" ", "_").replace(",", "")
            train(cfg, run)
            records = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                       if "time/step_s" in r and r["step"] > 1]
            out[name] = {key: statistics.mean(r.get(metric, 0.0) for r in records) for key, metric in
                         (("step_s", "time/step_s"), ("wait_s", "async/wait_s"),
                          ("rollout_s", "async/worker_rollout_s" if k else "time/rollout_s"))}
    torch.set_num_threads(threads)
    base = out["sync, 2 threads"]["step_s"]
    for timings in out.values():
        timings["vs_sync_2_threads"] = timings["step_s"] / base
    return out


def _one_rollout(cfg: Any, run: Any) -> tuple[float, list]:
    """One step's rollout under ``cfg``: its seconds and rows."""
    tasks = [run.workflow.env.task("train", i) for i in range(cfg.rollout.tasks_per_step)]
    seconds, result = timed(lambda: run.rollout.play(tasks, cfg.algorithm.num_generations, random.Random(0)), 1)
    return seconds, result.samples


def _learn_timings(cfg: Any, run: Any, samples: list, workdir: Path, repeats: int) -> dict[str, float]:
    """The median seconds of each part of learning from ``samples`` under ``cfg`` (fresh critics and learners)."""
    from marl_cli.critics.phase import CriticPhase

    critics = CriticPhase(cfg, run.world) if cfg.critic.name != "none" else None
    if critics is not None:
        critics.build(run.policies, workdir)
    trainers = learners(run, workdir)[0]
    rows = [copy.deepcopy(s) for s in samples]
    parts = {"critic_score_s": lambda: critics and critics.annotate(rows),
             "advantages_s": lambda: ALGORITHMS.get(cfg.algorithm.name).advantages(rows, cfg.algorithm,
                                                                                   random.Random(0), None),
             "update_s": lambda: [t.update([r for r in rows if r.policy == n], random.Random(0))
                                  for n, t in trainers.items()],
             "critic_update_s": lambda: critics and critics.update(rows, 1, random.Random(0))}
    out = {name: timed(part, repeats)[0] for name, part in parts.items()}
    out["learn_s"] = sum(out.values())
    out["rows"] = float(len(rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/report.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", action="store_true", help="compare the rollout backends (vLLM vs HF) "
                        "instead; needs vLLM")
    parser.add_argument("--override", action="append", default=[], help="a config override for the backend "
                        "comparison (repeatable), e.g. rollout.vllm.enforce_eager=false")
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="backend comparison: a model "
                        "shape to run (repeatable; default: all)")
    parser.add_argument("--new-tokens", type=int, action="append", help="backend comparison: a completion "
                        "length (repeatable; default: each shape's)")
    parser.add_argument("--prompts", type=int, default=16, help="backend comparison: prompts per call")
    parser.add_argument("--samples", type=int, default=8, help="backend comparison: samples per prompt")
    parser.add_argument("--only-async", action="store_true", help="measure only the asynchronous rollouts' wall "
                        "per step")
    parser.add_argument("--only-values", action="store_true", help="measure only the value methods' learning "
                        "halves against AT-GRPO's")
    parser.add_argument("--experiment", action="append", help="an experiment whose settings are measured "
                        "(repeatable; default: embedded, toy/plan_path_at_grpo_shared, toy/research_mgrpo)")
    args = parser.parse_args()
    register_configs()
    experiments = args.experiment or ["embedded", "toy/plan_path_at_grpo_shared", "toy/research_mgrpo"]
    report: dict[str, object] = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "processor": platform.processor() or platform.machine()},
        "repeats": args.repeats,
    }
    if args.only_async:
        report["async_rollouts"] = measure_async()
    elif args.only_values:
        report["value_methods"] = measure_values(args.repeats)
    elif args.backends:
        report["backends"] = measure_backends(args.repeats, args.override, args.prompts, args.samples, args.shape,
                                              args.new_tokens)
    else:
        report["experiments"] = {name: measure(name, args.repeats) for name in experiments}
        report["store"] = measure_store(512, args.repeats)
        report["value_methods"] = measure_values(args.repeats)
        report["async_rollouts"] = measure_async()
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
