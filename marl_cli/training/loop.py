"""The one training loop, shared by every algorithm and policy regime.

    rollout (batched per policy) → sample rows → advantages (algorithms/) → per-policy TRL update
    → metrics.jsonl / W&B → periodic eval → periodic checkpoint

Single-agent GRPO is the degenerate case: one role, one policy, one turn, groups keyed by task.
AT-GRPO is the same loop with tree rollouts (``algorithm.mode=tree``) over a multi-agent workflow;
under ``lora_per_role`` the warm start trains the base model before the adapters are attached.
M-GRPO is the same loop with trajectory-level advantages; its decoupled trainers
(``trainer.role=main|sub``, see ``training/decoupled.py``) run this loop in two processes, the
sub trainer taking its rows from the store instead of from rollouts.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_config, sub_roles
from marl_cli.policies.regime import Policy, attach_adapters, build_policies
from marl_cli.policies.roles import LORA_BASE, assign_roles
from marl_cli.rollout.backends import BACKENDS
from marl_cli.rollout.engine import rollout_metrics, row_metrics, run_episodes
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.rollout.samples import Sample
from marl_cli.store import build_store
from marl_cli.tracking.completions import completion_records
from marl_cli.tracking.tracker import LogFile, Tracker, write_json
from marl_cli.training.build import build_team, resolve_device, sampling_from
from marl_cli.training.checkpoint import latest_checkpoint, load_state, save_checkpoint
from marl_cli.training.decoupled import Exchange
from marl_cli.training.evaluation import evaluate
from marl_cli.training.policy_trainer import PolicyTrainer
from marl_cli.training.warmstart import cached_warm_start
from marl_cli.workflows.base import Workflow

log = logging.getLogger(__name__)
READABLE_ROWS = 4
"""Completions per agent written to ``samples.jsonl`` (training rows every ``log_completions_every`` steps;
at the final eval, every row of this many episodes)."""
STEP_LINE_KEYS = (("reward", "train/reward"), ("success", "train/success"))
STEP_LINE_POLICY_KEYS = ("loss", "kl_old", "entropy", "logprob_gap/mean")


def step_line(step: int, steps: int, metrics: dict[str, float], policies: list[str]) -> str:
    """One line of ``train.log`` for a logged step: reward, success, per-policy loss and diagnostics, step time."""
    parts = [f"step {step}/{steps}"]
    parts += [f"{label} {metrics[key]:.4f}" for label, key in STEP_LINE_KEYS if key in metrics]
    for name in policies:
        shown = [f"{k} {metrics[f'train/{name}/{k}']:.4g}" for k in STEP_LINE_POLICY_KEYS
                 if f"train/{name}/{k}" in metrics]
        if shown:
            parts.append(f"[{name}] " + " ".join(shown))
    parts.append(f"{metrics['time/step_s']:.1f} s")
    return " | ".join(parts)


def update_policies(samples: list[Sample], cfg: DictConfig, trainers: dict[str, PolicyTrainer],
                    trained_roles: set[str], rng: random.Random,
                    rollouts: dict[int, list[int]] | None = None) -> tuple[dict[str, float], list[Sample]]:
    """Advantages for ``samples``, then one update per trainer on its policy's rows of ``trained_roles``.

    Returns the metrics and the rows as trained (M-GRPO's aligned copies, each with its advantage).
    """
    rows, stats = ALGORITHMS.get(cfg.algorithm.name).advantages(samples, cfg.algorithm, rng, rollouts)
    metrics = {f"train/{k}": v for k, v in stats.items()}
    metrics["train/reward"] = sum(s.reward for s in samples) / max(len(samples), 1)
    for name, trainer in trainers.items():
        mine = [s for s in rows if s.policy == name and s.role in trained_roles]
        for key, value in trainer.update(mine, rng).items():
            metrics[f"train/{name}/{key}"] = value
    return metrics, rows


def rl_step(step: int, cfg: DictConfig, workflow: Workflow, policies: dict[str, Policy], role_map: dict[str, str],
            trainers: dict[str, PolicyTrainer], trained_roles: set[str], sampling: Sampling,
            generator: HFGenerator, rng: random.Random,
            exchange: Exchange | None = None) -> tuple[dict[str, float], list[Sample]]:
    """One RL step: rollouts on this step's training tasks, advantages, one update per trained policy.

    Returns the step's metrics and its rows as trained (with their advantages).

    A decoupled main trainer (``exchange``) first loads the sub policy's newest weights and hands the
    rollout's sub-trajectories to the store; a decoupled sub trainer takes its rows from the store.
    """
    t0 = time.perf_counter()
    metrics: dict[str, float] = {}
    if exchange is not None and exchange.role == "sub":
        samples, rollouts, metrics = exchange.receive(step)
        workflow.rescore(samples)  # the sub trainer's own reward coefficients
        metrics.update(row_metrics(samples, "train"))
    else:
        if exchange is not None:
            metrics.update(exchange.refresh(policies, step - 1))
        per_step = cfg.rollout.tasks_per_step
        tasks = [workflow.env.task("train", (step - 1) * per_step + j) for j in range(per_step)]
        result = run_episodes(workflow, policies, role_map, tasks, cfg.algorithm.num_generations, sampling,
                              generator, cfg.algorithm.mode, cfg.algorithm.selection, rng)
        samples, rollouts = result.samples, None
        metrics.update(rollout_metrics(result, "train"))
        if exchange is not None:
            metrics.update(exchange.send(step, samples))
    t_rollout = time.perf_counter() - t0
    update_metrics, trained = update_policies(samples, cfg, trainers, trained_roles, rng, rollouts)
    metrics.update(update_metrics)
    if exchange is not None and exchange.role == "sub":
        exchange.publish(step, policies)
    metrics["time/rollout_s"] = t_rollout
    metrics["time/step_s"] = time.perf_counter() - t0
    return metrics, trained


def warm_start_all(policies: dict[str, Policy], workflow: Workflow, cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    """Warm-start every policy; return the ``warmstart/<policy>/...`` metrics.

    With ``trainer.warmstart.shared_base`` (default) and several policies, one model is warm-started on
    the demonstrations of every role and each policy starts as a copy of it, as every policy of the
    papers starts from one pre-trained model; otherwise each policy learns its own roles' demonstrations.
    """
    if cfg.trainer.warmstart.shared_base and len(policies) > 1:
        first, *others = policies.values()
        roles = [role for p in policies.values() for role in p.roles]
        base = Policy("base", first.model, first.tokenizer, first.source, roles, compute_dtype=first.compute_dtype)
        stats = cached_warm_start(base, workflow, cfg, run_dir / "warmstart" / "base")
        for policy in others:
            policy.model.load_state_dict(first.model.state_dict())
        return {f"warmstart/base/{k}": v for k, v in stats.items()}
    metrics = {}
    for name, policy in policies.items():
        stats = cached_warm_start(policy, workflow, cfg, run_dir / "warmstart" / name)
        metrics.update({f"warmstart/{name}/{k}": v for k, v in stats.items()})
    return metrics


def trained_roles_of(cfg: DictConfig, roles: list[str]) -> set[str]:
    """The roles this process updates: all but the frozen ones, split by ``trainer.role`` when decoupled."""
    trained = set(roles) - set(cfg.trainer.frozen_roles)
    subs = set(cfg.algorithm.aligned_roles) if ALGORITHMS.get(cfg.algorithm.name).hierarchical else set()
    if cfg.trainer.role == "main":
        return trained - subs
    if cfg.trainer.role == "sub":
        return trained & subs
    return trained


def initial_policies(checkpoint: Path, names: set[str]) -> dict[str, str]:
    """Where each policy starts under ``trainer.init_from``: ``<checkpoint>/policies/<name>`` (full models)."""
    missing = sorted(n for n in names if not (checkpoint / "policies" / n / "config.json").exists())
    if missing:
        raise ConfigError(f"trainer.init_from={checkpoint}: no saved model for policies {missing} under "
                          f"{checkpoint / 'policies'}")
    return {name: str(checkpoint / "policies" / name) for name in names}


def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run (or resume) one training run; return its summary (also written to ``summary.json``)."""
    check_config(cfg)
    checkpoint = None
    if cfg.trainer.resume:
        run_dir = Path(cfg.trainer.resume).resolve()
        checkpoint = latest_checkpoint(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)

    workflow = build_team(cfg)
    role_map = assign_roles(cfg.policy, workflow.roles)
    subs = sub_roles(cfg, role_map)
    trained_roles = trained_roles_of(cfg, workflow.roles)
    exchange = None
    if cfg.trainer.role != "all":
        exchange = Exchange(build_store(cfg.store), cfg, run_dir, subs, role_map[subs[0]])
    sub_only = cfg.trainer.role == "sub"  # the decoupled sub trainer: no rollouts, no eval, the sub policy only
    owned = {r: p for r, p in role_map.items() if not sub_only or r in exchange.sub_roles}
    lora = cfg.policy.name == "lora_per_role"
    saved = None
    if checkpoint is not None:
        saved = {name: str(checkpoint / "policies" / name) for name in set(owned.values())}
    elif cfg.trainer.init_from:
        saved = initial_policies(Path(cfg.trainer.init_from), set(owned.values()))
    sources = {LORA_BASE: str(run_dir / LORA_BASE)} if lora and checkpoint is not None else saved
    policies = build_policies(owned, cfg.model, cfg.seed, run_dir, device, sources, cfg.policy.name,
                              master_weights=True)
    routing = dict.fromkeys(role_map, LORA_BASE) if lora else role_map  # lora: the base serves until adapters attach

    summary_path = run_dir / "summary.json"
    summary: dict[str, Any] = {"status": "running", "command": "train", "name": cfg.name, "run_dir": str(run_dir),
                               "env": cfg.env.name,
                               "workflow": cfg.workflow.name, "algorithm": cfg.algorithm.name,
                               "regime": cfg.policy.name, "trainer_role": cfg.trainer.role, "steps": 0,
                               "total_steps": cfg.trainer.steps, "policies": {n: p.roles for n, p in policies.items()}}
    if checkpoint is not None and summary_path.exists():
        summary.update(json.loads(summary_path.read_text()), status="running")
    write_json(summary_path, summary)

    tracker = Tracker(run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True), f"{cfg.name}-{run_dir.name}")
    generator = BACKENDS.get(cfg.rollout.backend)(cfg)
    train_sampling = sampling_from(cfg.rollout, cfg.model, cfg.rollout.temperature)
    eval_sampling = sampling_from(cfg.rollout, cfg.model, cfg.rollout.eval_temperature)
    rng = random.Random(cfg.seed)
    counters = {"store/trajectories": 0.0}  # decoupled: sub-trajectories written (main) or trained on (sub)

    def run_eval(prefix: str, step: int, readable: int = 0) -> dict[str, float]:
        if sub_only:
            return {}
        rows: list[Sample] = []
        metrics = evaluate(workflow, policies, routing, cfg.env.eval_size, eval_sampling, generator, prefix,
                           rows=rows, progress=cfg.progress)
        tracker.log(step, metrics)
        tracker.log_samples(step, completion_records(rows, tokenizers(), step, prefix, readable), f"{prefix}/samples")
        summary.update(metrics)
        write_json(summary_path, summary)
        return metrics

    def tokenizers() -> dict[str, Any]:
        return {name: p.tokenizer for name, p in policies.items()}

    trainers: dict[str, PolicyTrainer] = {}
    acked = 0  # decoupled sub: steps whose items are acknowledged (at checkpoints: every step unless save_every)
    save_every = cfg.trainer.save_every or (1 if sub_only else 0)

    def save(step: int) -> None:
        nonlocal acked
        path = save_checkpoint(run_dir, step, policies, {n: t.state_dict() for n, t in trainers.items()}, rng,
                               counters)
        log.info("checkpoint: step %d saved to %s", step, path)
        if sub_only:
            exchange.acknowledge(range(acked + 1, step + 1))
            acked = step

    log_file = LogFile(run_dir / "train.log")
    if checkpoint is not None:
        log.info("resuming %s from %s", run_dir, checkpoint.name)
    start = 0
    step = 0
    try:
        if checkpoint is None and cfg.trainer.warmstart.enabled and not sub_only and not cfg.trainer.init_from:
            run_eval("eval_pre_warmstart", 0)
            tracker.log(0, warm_start_all(policies, workflow, cfg, run_dir))
        if lora:
            policies = attach_adapters(policies[LORA_BASE], role_map, cfg.policy, run_dir,
                                       saved if checkpoint is not None else None)
            routing = role_map
            summary["policies"] = {n: p.roles for n, p in policies.items()}
        if exchange is not None and checkpoint is None:
            exchange.start(policies)
        if checkpoint is None:
            run_eval("eval_before", 0)
        for name, policy in policies.items():
            if not set(policy.roles) & trained_roles:
                continue
            trainers[name] = PolicyTrainer(policy, cfg.trainer, cfg.rollout.temperature, cfg.rollout.max_new_tokens,
                                           run_dir / "trl" / name, cfg.seed)
            policy.model = trainers[name].model
        if checkpoint is not None:
            state = load_state(checkpoint)
            for name, trainer in trainers.items():
                trainer.load_state_dict(state["trainers"][name])
            rng.setstate(state["python_rng"])
            torch.set_rng_state(state["torch_rng"])
            counters.update(state.get("extra", {}))
            start = acked = state["step"]
            if sub_only:  # a crash between the checkpoint and its acknowledgement leaves them unacknowledged
                exchange.acknowledge(range(1, start + 1))
        step = start
        bar = tqdm(range(start + 1, cfg.trainer.steps + 1), initial=start, total=cfg.trainer.steps,
                   desc=cfg.name, disable=not cfg.progress, dynamic_ncols=True)
        for step in bar:
            metrics, samples = rl_step(step, cfg, workflow, policies, role_map, trainers, trained_roles,
                                       train_sampling, generator, rng, exchange)
            counters["store/trajectories"] += metrics.get("store/written", metrics.get("store/read", 0.0))
            metrics.update(counters if exchange is not None else {})
            summary["steps"] = step
            if step % cfg.trainer.log_every == 0 or step == cfg.trainer.steps:
                tracker.log(step, metrics)
                log.info(step_line(step, cfg.trainer.steps, metrics, list(trainers)))
            every = cfg.trainer.log_completions_every
            if every and step % every == 0:
                records = completion_records(samples, tokenizers(), step, "train", READABLE_ROWS,
                                             random.Random(step))
                tracker.log_samples(step, records, "train/samples")
            bar.set_postfix(reward=f"{metrics['train/reward']:.3f}", step_s=f"{metrics['time/step_s']:.1f}")
            if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step < cfg.trainer.steps:
                run_eval("eval", step)
            if save_every and step % save_every == 0 and step < cfg.trainer.steps:
                save(step)
        bar.close()
        if cfg.trainer.role == "main" and cfg.trainer.sync:  # evaluate with the sub policy trained on every step
            exchange.refresh(policies, step)
        run_eval("eval", step, READABLE_ROWS if cfg.trainer.log_completions_every else 0)
        save(step)
        summary.update(counters if exchange is not None else {})
        summary["status"] = "completed"
    except KeyboardInterrupt:
        summary["status"] = "interrupted"
        if summary["steps"] > start:
            save(summary["steps"])
        raise
    except Exception as exc:
        summary["status"] = "failed"
        summary["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        write_json(summary_path, summary)
        tracker.finish(summary)
        if exchange is not None:
            exchange.store.close()
        log.info("run %s: %s after %d steps", run_dir, summary["status"], summary["steps"])
        log_file.close()
    return summary
