"""Supervised warm start on oracle demonstrations, through TRL's SFTTrainer."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import time
from contextlib import ExitStack
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf
from transformers import PrinterCallback, TrainerCallback

from marl_cli.config.errors import ConfigError
from marl_cli.config.team import model_key, policy_model
from marl_cli.core.world import World
from marl_cli.policies.regime import Policy
from marl_cli.rollout.generation import Sampling
from marl_cli.tracking.console import draws_bars
from marl_cli.training.build import build_team, init_seed, sampling_from
from marl_cli.training.learner.trl_args import SFTConfig, SFTTrainer, checkpointing_off
from marl_cli.workflows.base import TeamState, Workflow

log = logging.getLogger(__name__)


def demonstrations(workflow: Workflow, roles: list[str], num_examples: int,
                   sampling: Sampling, policy: Policy, chunk: int = 64) -> Dataset:
    """``num_examples`` prompt/completion pairs per role, from the oracle playing whole warm-start episodes.

    The oracle's answer for every role is played through the workflow (tool code runs in the
    sandbox), so later roles and turns see the states the team actually reaches; a role is also taught in the
    workflow's ``practice_states`` (a judge shown a wrong answer), which are not played. Every role gets
    the same number of demonstrations, so a policy serving two roles trains on twice as many.
    Warm-start tasks are disjoint from RL and eval tasks. Prompts are formatted by ``sampling`` (the
    run's training sampling: chat template, each role's system message), as rollouts format them.
    """
    env = workflow.env
    pairs: dict[str, list[tuple[str, str]]] = {role: [] for role in roles}
    index = 0
    while min(len(p) for p in pairs.values()) < num_examples:
        if index >= 100 * num_examples + 1000:
            missing = [role for role, p in pairs.items() if len(p) < num_examples]
            raise ConfigError(f"the {env.cfg.name} oracle gives too few demonstrations for roles {missing}; "
                              "disable trainer.warmstart")
        states = [workflow.initial_state(env.task("warmstart", index + i)) for i in range(chunk)]
        index += chunk
        for turn in range(workflow.max_turns):
            for stage in workflow.stages(turn):
                start = states
                for role in stage:
                    live = [(i, s) for i, s in enumerate(states) if not s.done and workflow.acting(role, start[i])]
                    demos = [(i, workflow.demonstration(role, start[i])) for i, _ in live]
                    demos = [(i, d) for i, d in demos if d is not None]
                    if role in pairs:
                        as_seen = sampling.for_role(role)  # prompts exactly as rollouts format them
                        pairs[role] += [(as_seen.prompt(policy.tokenizer, workflow.prompt(role, s)), demo)
                                        for s, demo in _taught(workflow, role, [(start[i], d) for i, d in demos])]
                    outcomes = workflow.act_many(role, [(states[i], demo) for i, demo in demos])
                    states = list(states)
                    for (i, _), out in zip(demos, outcomes, strict=True):
                        states[i] = out.state
                    given = {i for i, _ in demos}
                    for i, _ in live:
                        if i not in given:  # no oracle answer from here: the episode ends
                            states[i] = replace(states[i], done=True)
    chosen = [pair for role in roles for pair in pairs[role][:num_examples]]
    return Dataset.from_dict({"prompt": [p for p, _ in chosen], "completion": [c for _, c in chosen]})


def _taught(workflow: Workflow, role: str, demos: list[tuple[TeamState, str]]) -> list[tuple[TeamState, str]]:
    """The (state, demonstration) pairs played, each followed by the workflow's practice states for it."""
    out = []
    for state, demo in demos:
        out.append((state, demo))
        for practice in workflow.practice_states(role, state):
            answer = workflow.demonstration(role, practice)
            if answer is not None:
                out.append((practice, answer))
    return out


class ProgressLog(TrainerCallback):
    """One log line (``train.log``) per tenth of a warm start: step, loss, elapsed and estimated time left."""

    def __init__(self, name: str):
        self.name, self.start = name, time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if not logs or "loss" not in logs or not state.max_steps:
            return
        elapsed = time.perf_counter() - self.start
        left = elapsed * (state.max_steps - state.global_step) / max(state.global_step, 1)
        log.info("warm start %s: step %d/%d (%d%%), loss %.4f, %.0f s elapsed, ~%.0f s left", self.name,
                 state.global_step, state.max_steps, 100 * state.global_step // state.max_steps, logs["loss"],
                 elapsed, left)


def warm_start(policy: Policy, data: Dataset, cfg: Any, output_dir: Path, seed: int, progress: bool = False,
               world: World | None = None) -> dict[str, float]:
    """Fine-tune ``policy`` on ``data`` (``demonstrations`` for its roles); return TRL's final training metrics.

    A bf16/fp16 policy with fp32 master weights trains under autocast (TRL's mixed precision);
    ``progress`` shows TRL's progress bar. Across several processes (``world``) TRL trains data-parallel,
    each rank on ``batch_size / ranks`` rows of every batch, so the global batch stays ``batch_size``.
    """
    world = world or World()
    start = time.perf_counter()
    log.info("warm start %s (roles %s): %d demonstrations, %s epochs", policy.name, ", ".join(policy.roles),
             len(data), cfg.epochs)
    steps = math.ceil(len(data) / cfg.batch_size) * math.ceil(cfg.epochs)
    args = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size // world.size,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_ratio,
        **checkpointing_off(),
        use_cpu=policy.model.device.type == "cpu",
        bf16=policy.autocast_dtype == torch.bfloat16,
        fp16=policy.autocast_dtype == torch.float16,
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=max(1, steps // 10),
        disable_tqdm=not draws_bars(progress, world.main),  # a bar only on a terminal
        seed=seed,
    )
    trainer = SFTTrainer(model=policy.model, args=args, train_dataset=data, processing_class=policy.tokenizer)
    trainer.remove_callback(PrinterCallback)  # marl logs progress and the result itself
    trainer.add_callback(ProgressLog(policy.name))
    result = trainer.train()
    policy.mark_updated()
    log.info("warm start %s: loss %.4f after %d steps (%.0f s)", policy.name, result.training_loss,
             result.global_step, time.perf_counter() - start)
    return {"loss": float(result.training_loss), "examples": float(len(data)),
            "steps": float(result.global_step)}


def warm_start_key(cfg: DictConfig, roles: list[str], data: Dataset, model_cfg: Any = None) -> str:
    """What decides a warm start's weights: the model (``model_cfg``, default the run's), the warm-start settings,
    its seed (``init_seed``), the roles, the demonstrations themselves and the versions of the libraries that train on
    them. The env and the workflow enter through the demonstrations alone (their tasks, prompts and oracle answers:
    a changed prompt or oracle in the code is a new entry), so runs that differ only in what pays the rows (a
    workflow's reward settings, a reward model) share one warm start."""
    parts: dict[str, Any] = {"model": OmegaConf.to_container(cfg.model if model_cfg is None else model_cfg,
                                                               resolve=True)}
    parts["warmstart"] = {k: v for k, v in OmegaConf.to_container(cfg.trainer.warmstart, resolve=True).items()
                          if k != "cache"}
    demos = hashlib.sha256(json.dumps(data.to_dict(), sort_keys=True).encode()).hexdigest()
    parts.update(seed=init_seed(cfg), roles=roles, demonstrations=demos,
                 libraries={name: version(name) for name in ("torch", "transformers", "trl")})
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cached_warm_start(policy: Policy, workflow: Workflow, cfg: DictConfig, output_dir: Path,
                      world: World | None = None, model_cfg: Any = None) -> dict[str, float]:
    """``warm_start`` for ``policy``, reusing the weights of an identical warm start in ``trainer.warmstart.cache``.

    Runs of one sweep that warm-start the same way (the rows of a table that differ only after the
    warm start, or an RL hyperparameter sweep) train it once; a job that finds another job warming up
    the same entry waits for it (a file lock). Without a cache dir every run warm-starts itself. In a
    multi-process run rank 0 alone reads and writes the cache (the other ranks get its weights after
    the warm start, ``Trainer.prepare``). The demonstrations are part of the key: rank 0 draws them first, the
    other ranks only to train on them when the cache misses.
    """
    world = world or World()
    ws = cfg.trainer.warmstart
    sampling = sampling_from(cfg)
    seed = init_seed(cfg)  # a pinned warm-start seed draws its demonstrations from its own tasks

    def draw() -> Dataset:
        team = workflow if seed == cfg.seed else build_team(cfg, seed, workflow.env.sandbox)
        return demonstrations(team, policy.roles, ws.num_examples, sampling, policy)

    if not ws.cache:
        return warm_start(policy, draw(), ws, output_dir, seed, cfg.progress, world)
    root = Path(ws.cache).expanduser()
    data = draw() if world.main else None
    with ExitStack() as held:
        if world.main:
            key = warm_start_key(cfg, policy.roles, data, model_cfg)
            entry = root / key
            root.mkdir(parents=True, exist_ok=True)
            lock = held.enter_context((root / f"{key}.lock").open("a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        if world.from_main(world.main and (entry / "metrics.json").exists()):
            cached = None
            if world.main:
                policy.load_weights(entry)
                log.info("warm start %s: reused %s", policy.name, entry)
                cached = json.loads((entry / "metrics.json").read_text())
            return {**world.from_main(cached), "cached": 1.0}
        metrics = warm_start(policy, data if world.main else draw(), ws, output_dir, seed, cfg.progress, world)
        if world.main:
            tmp = root / f"{key}.tmp-{os.getpid()}"
            policy.save(tmp)
            (tmp / "metrics.json").write_text(json.dumps(metrics))
            os.replace(tmp, entry)
            log.info("warm start %s: saved to the cache as %s", policy.name, entry)
    return {**metrics, "cached": 0.0}


def warm_start_all(policies: dict[str, Policy], workflow: Workflow, cfg: DictConfig, run_dir: Path,
                   role_map: dict[str, str], world: World | None = None) -> dict[str, float]:
    """Warm-start every policy; return the ``warmstart/<name>/...`` metrics.

    With ``trainer.warmstart.shared_base`` (default), the policies that start from one model config (all of them
    unless ``policy.models`` gives some their own) warm-start one model on the demonstrations of all their roles
    (``base``; ``base_<policy>`` per group in a team of different models), and each starts as a copy of it, as
    every policy of the papers starts from one pre-trained model; otherwise each policy learns its own roles'
    demonstrations. Under an adapter regime ``policies`` are the frozen bases (one per model config): each
    warm-starts alone on the demonstrations of the roles it serves. Under ``trainer.swap_roles_every`` every policy
    will act for every role, so learns them all (but the scripted ones, ``policy.scripted``: no policy acts for them,
    and none learns their demonstrations).
    """
    groups: dict[str, list[Policy]] = {}
    # the model config of the policy a role acts through (a base's: that of the policies whose roles it serves)
    models = {name: policy_model(cfg, role_map[policy.roles[0]]) for name, policy in policies.items()}
    for name, policy in policies.items():
        groups.setdefault(model_key(models[name]), []).append(policy)
    shared = cfg.trainer.warmstart.shared_base
    metrics = {}
    for members in groups.values():
        parts = [members] if shared else [[p] for p in members]
        for first, *others in parts:
            name = first.name if not others else "base" if len(groups) == 1 else f"base_{first.name}"
            roles = [r for r in workflow.roles if r not in cfg.policy.scripted] if cfg.trainer.swap_roles_every else \
                [role for p in (first, *others) for role in p.roles]
            learner = Policy(name, first.model, first.tokenizer, first.source, roles, compute_dtype=first.compute_dtype)
            stats = cached_warm_start(learner, workflow, cfg, run_dir / "warmstart" / name, world, models[first.name])
            first.mark_updated()
            for policy in others:
                policy.model.load_state_dict(first.model.state_dict())
                policy.mark_updated()
            metrics.update({f"warmstart/{name}/{k}": v for k, v in stats.items()})
    return metrics
