"""The one training loop, shared by every algorithm and policy regime.

    rows (rollouts, or the store) → the reward model's scores → the credit method's turn rewards → advantages
    → the credit method's (token) advantages → per-policy TRL update
    → hooks: metrics.jsonl / W&B, periodic eval, periodic checkpoint

Single-agent GRPO is the degenerate case: one role, one policy, one turn, groups keyed by task.
AT-GRPO is the same loop with tree rollouts (``algorithm.mode=tree``) over a multi-agent workflow;
under ``lora_per_role`` the warm start trains each base model before its adapters are attached.
M-GRPO is the same loop with trajectory-level advantages; its decoupled trainers
(``trainer.role=main|sub``, see ``training/rows/decoupled.py``) run this loop in two processes, the
sub trainer taking its rows from the store (``training/rows/sources.py``) instead of from rollouts.
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

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config.team import Schedule, policy_loss, policy_trainer
from marl_cli.core.samples import Sample
from marl_cli.credit.base import shape_advantages, shape_rewards
from marl_cli.critics.kinds import CRITICS
from marl_cli.critics.phase import CriticPhase
from marl_cli.policies.regime import Policy, checkpoint_adapters
from marl_cli.policies.roles import sub_roles
from marl_cli.provenance import run_provenance
from marl_cli.rewards import Rewarder, build_rewards
from marl_cli.store import build_store
from marl_cli.tracking.completions import completion_records
from marl_cli.tracking.tracker import LogFile, Tracker, write_json
from marl_cli.training.build import Run, build_run
from marl_cli.training.checkpoint import RunState, load_state, prune_checkpoints, save_checkpoint
from marl_cli.training.evaluation import evaluate
from marl_cli.training.hooks import CheckpointHook, EvalHook, Hook, LogHook
from marl_cli.training.interrupts import StopRequest
from marl_cli.training.learner.policy_trainer import PolicyTrainer
from marl_cli.training.pool import opponent_pool
from marl_cli.training.rows.decoupled import Exchange
from marl_cli.training.rows.sources import RolloutRows, row_source
from marl_cli.training.warmstart import warm_start_all

log = logging.getLogger(__name__)


def trained_roles_of(cfg: DictConfig, roles: list[str]) -> set[str]:
    """The roles this process updates: all but the frozen ones, split by ``trainer.role`` when decoupled."""
    trained = set(roles) - set(cfg.trainer.frozen_roles)
    subs = set(cfg.algorithm.aligned_roles) if ALGORITHMS.get(cfg.algorithm.name).hierarchical else set()
    if cfg.trainer.role == "main":
        return trained - subs
    if cfg.trainer.role == "sub":
        return trained & subs
    return trained


class Trainer:
    """One training run: its policies' TRL trainers, where each step's rows come from, and the hooks.

    Args:
        run: what the run acts with (``build_run``; a resumed run continues from ``run.source.resumed``).
        source: where each step's rows come from (``training/rows/sources.py``; default: the run's, ``row_source``).
    """

    def __init__(self, run: Run, source: RolloutRows | None = None):
        cfg = run.cfg
        self.run, self.cfg, self.checkpoint = run, cfg, run.source.resumed
        self.source = source or row_source(run)
        self.trained_roles = trained_roles_of(cfg, run.workflow.roles)
        self.schedule = Schedule.of(cfg, run.role_map)
        self.trainers: dict[str, PolicyTrainer] = {}
        self.critics = CriticPhase(cfg, run.world) if CRITICS.get(cfg.critic.name).level else None
        """The run's value models (``critic``), or None (a critic-free algorithm)."""
        self.rewards: Rewarder | None = None
        """The run's reward model over its rows (``reward``; built by ``prepare``), or None (the program's rewards)."""
        if self.critics is not None:
            self.critics.check_tokenizers(run.policies)
        self.rng = random.Random(cfg.seed)
        self.counters = {"store/trajectories": 0.0}  # decoupled: sub-trajectories written (main) or trained (sub)
        self.memory: dict[str, Any] = {}  # the algorithm's state across steps (``Algorithm.memory``), checkpointed
        self.start = self.step = 0
        self.mid_step = False  # the weights may hold part of an update: an interrupt now saves nothing
        self.hooks: list[Hook] = [LogHook(), EvalHook(), CheckpointHook(cfg.trainer.save_every or
                                                                        self.source.save_every)]
        if cfg.get("pool") is not None and cfg.pool.every:  # before the log: it logs the pool's draw with the step
            self.hooks.insert(0, opponent_pool(cfg, run))
        self.summary = self._summary()
        self.tracker = Tracker(run.run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True), "train",
                               writes=run.world.main)

    def fit(self) -> dict[str, Any]:
        """Prepare, train ``trainer.steps`` steps (from the checkpoint's on resume), finish; return the summary."""
        log_file = LogFile(self.run.run_dir / "train.log" if self.run.world.main else None)
        status = "failed"
        try:
            with StopRequest() as stop:
                self.prepare()
                self._call("on_start")
                for step in range(self.start + 1, self.cfg.trainer.steps + 1):
                    stop.in_step = self.mid_step = True
                    metrics, rows = self.train_step(step)
                    self.step = self.summary["steps"] = step
                    self.mid_step = False
                    self._call("on_step", step, metrics, rows)
                    stop.in_step = False
                    if any(self.run.world.gather(stop.requested)):  # every rank stops after the same step
                        raise KeyboardInterrupt
            self.source.finish(self.step)
            self._call("on_end", self.step)
            self.summary.update(self.source.report(self.counters))
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            self._call("on_interrupt")
            raise
        except Exception as exc:
            self.summary["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.close(status)
            log_file.close()
        return self.summary

    def prepare(self) -> None:
        """The warm-start phase (fresh runs), the LoRA adapters, ``eval_before``, the TRL trainers, a resume."""
        cfg, fresh = self.cfg, self.checkpoint is None
        if fresh and cfg.trainer.warmstart.enabled and self.source.plays and not cfg.trainer.init_from:
            self.evaluate("eval_pre_warmstart", 0)
            run = self.run
            self.tracker.log(0, warm_start_all(run.policies, run.workflow, cfg, run.run_dir, run.role_map, run.world))
        self.share_weights()
        if self.run.adapters_pending:
            self.attach_adapters()
            self.share_weights()
        if fresh:
            self.source.start(self.run.policies)
            self.evaluate("eval_before", 0)
        for name, policy in self.run.policies.items():
            if name in self.schedule.trainable and (self.schedule.swap_every or set(policy.roles) & self.trained_roles):
                self.trainers[name] = self.policy_trainer(name, policy)
        if self.critics is not None:  # from the policies as RL found them (a resume then loads its own)
            self.critics.build(self.run.policies, self.run.run_dir)
        self.rewards = build_rewards(cfg, self.run)  # a judging policy as RL found it (adapters attached)
        if not fresh:
            self.restore(self.checkpoint)

    def policy_trainer(self, name: str, policy: Policy) -> PolicyTrainer:
        """The TRL trainer of policy ``name``: ``trainer`` with its ``policy.trainers.<name>`` changes, its
        learning-rate schedule as long as the steps it trains (``Schedule.steps_of``), its rows scored at the
        temperature each was sampled at (its first role's where a row does not say) and ``dr_grpo``'s length its
        roles' longest."""
        cfg, sampling = self.cfg, self.run.sampling
        settings = policy_trainer(cfg, name)
        settings.steps = self.schedule.steps_of(name, cfg.trainer.steps)
        roles = [sampling.for_role(role) for role in policy.roles]
        return PolicyTrainer(policy, settings, roles[0].temperature, max(r.max_new_tokens for r in roles),
                             self.run.run_dir / "trl" / name, cfg.seed, self.run.world, policy_loss(cfg, name))

    def share_weights(self) -> None:
        """Every process of a multi-process run continues from rank 0's weights (its warm start, its adapters)."""
        if self.run.world.size > 1:
            for policy in self.run.policies.values():
                self.run.world.broadcast_module(policy.model)
                policy.mark_updated()

    def attach_adapters(self) -> None:
        """``lora_per_role``: split each (warm-started) base into one adapter per policy it serves; a resume loads
        them."""
        run = self.run
        names = set(run.role_map.values())
        run.attach_adapters(checkpoint_adapters(self.checkpoint, names))
        self.summary["policies"] = {n: p.roles for n, p in run.policies.items()}

    def train_step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        """One RL step: this step's rows, advantages, one update per trained policy; its metrics and rows as trained."""
        t0 = time.perf_counter()
        if self.schedule.swap_every:
            self.run.rollout.routing = {**self.run.routing, **self.schedule.routing(self.run.role_map, step)}
        samples, rollouts, metrics = self.source.rows(step, self.rng)
        t_rollout = time.perf_counter() - t0
        if self.rewards is not None:
            metrics.update(self.rewards.apply(samples))
        self.run.generator.release()
        metrics["train/reward"] = sum(s.reward for s in samples) / max(len(samples), 1)
        metrics.update(self.run.staleness.metrics([s for s in samples if s.role in self.trained_roles], step))
        if self.critics is not None:
            self.critics.annotate(samples)
        rows = self.advantages(samples, rollouts, metrics)
        warming = ((self.critics is not None and self.critics.warming(step))  # the critic or the reward model
                   or (self.rewards is not None and self.rewards.warming(step)))  # learns, the policies wait
        active = set() if warming else self.schedule.training(step)
        for name, trainer in self.trainers.items():
            metrics[f"train/{name}/active"] = float(name in active)
            if name not in active:  # its turn is to come: weights, optimiser and lr schedule stay as they are
                continue
            mine = [s for s in rows if s.policy == name and s.role in self.trained_roles]
            if not any(s.keep for s in mine):
                self.nothing_to_train(step, name, len(mine), metrics)
            stats = trainer.update(mine, self.rng, step - 1)  # k = step − 1 steps done before it
            metrics.update({f"train/{name}/{k}": v for k, v in stats.items()})
            metrics[f"train/{name}/skipped_steps"] = self.counters.get(f"train/{name}/skipped_steps", 0.0)
        if self.critics is not None:
            t_critic = time.perf_counter()
            metrics.update(self.critics.update(rows, step, self.rng))
            metrics["time/critic_s"] = time.perf_counter() - t_critic
        self.source.after_update(step)
        self.counters["store/trajectories"] += metrics.get("store/written", metrics.get("store/read", 0.0))
        metrics.update(self.source.report(self.counters))
        metrics["time/rollout_s"] = t_rollout
        metrics["time/step_s"] = time.perf_counter() - t0
        return metrics, rows

    def advantages(self, samples: list[Sample], rollouts: dict[int, list[int]] | None,
                   metrics: dict[str, float]) -> list[Sample]:
        """The rows as trained: the credit method's turn rewards (``credit``), the algorithm's advantages, then the
        credit method's token advantages; their statistics go into ``metrics``."""
        t0 = time.perf_counter()
        metrics.update(shape_rewards(samples, self.cfg, self.run))
        algorithm = ALGORITHMS.get(self.cfg.algorithm.name)
        memory = {"memory": self.memory} if algorithm.memory else {}
        rows, stats = algorithm.advantages(samples, self.cfg.algorithm, self.rng, rollouts, **memory)
        metrics.update({f"train/{k}": v for k, v in stats.items()})
        metrics.update(shape_advantages(rows, self.cfg, self.run))
        if self.cfg.credit.name != "none":
            metrics["time/credit_s"] = time.perf_counter() - t0
        return rows

    def nothing_to_train(self, step: int, name: str, rows: int, metrics: dict[str, float]) -> None:
        """Warn that policy ``name`` has no row to train on at ``step`` (and count it): its update makes no
        gradient step, so the weights and the optimiser state stay as they are; the learning-rate schedule still
        advances, as it is a function of the step (a later step's rate does not depend on earlier empty ones)."""
        key = f"train/{name}/skipped_steps"
        self.counters[key] = self.counters.get(key, 0.0) + 1
        if not self.run.world.main:  # every rank counts, rank 0 reports
            return
        why = f"{rows} rows of its roles, none kept by algorithm.filter" if rows else "no rows of its roles"
        why += self.source.why_empty(metrics)
        log.warning("step %d: nothing to train policy %r on (%s): no gradient step, the weights and optimiser "
                    "state stay as they are (the lr schedule advances); %s = %d", step, name, why, key,
                    self.counters[key])

    def evaluate(self, prefix: str, step: int, readable: int = 0) -> dict[str, float]:
        """Success on ``env.eval_size`` held-out tasks as ``eval.*`` says (greedy by default; pass@k when it samples
        several episodes a task), logged and kept in the summary (not in a trainer that plays no episodes: the
        decoupled sub trainer)."""
        if not self.source.plays:
            return {}
        run, rows, settings = self.run, [], self.cfg.eval
        pass_k = tuple(settings.pass_k) if settings.samples > 1 else ()  # one episode a task: pass@1 is success
        metrics = evaluate(run, prefix, settings.samples, pass_k, rows=rows)
        self.tracker.log(step, metrics)
        self.tracker.log_samples(step, completion_records(rows, run.tokenizers(), step, prefix, readable),
                                 f"{prefix}/samples")
        self.summary.update(metrics)
        self.write_summary()
        return metrics

    def save(self, step: int) -> None:
        """Checkpoint ``step``; a decoupled sub trainer then acknowledges the store items the checkpoint holds."""
        state = RunState(step)
        state.add("trainers", {n: t.state_dict() for n, t in self.trainers.items()})  # every rank: sharded, gathered
        ahead = self.run.world.gather(self.source.in_flight(step))  # rows played for later steps, every rank's
        masters = {n: w for n, t in self.trainers.items() if (w := t.master_weights()) is not None}
        if not self.run.world.main:  # the ranks' weights and (gathered) optimiser states are identical
            return
        state.add("extra", self.counters)
        state.add("algorithm", self.memory)
        state.add("critics", None if self.critics is None else self.critics.state_dict())
        state.add("reward", None if self.rewards is None else self.rewards.state_dict())
        state.add("in_flight", {"ranks": ahead} if any(ahead) else None)
        path = save_checkpoint(self.run.run_dir, state, self.run.policies, self.rng, masters,
                               None if self.rewards is None else self.rewards.save)
        log.info("checkpoint: step %d saved to %s", step, path)
        self.source.saved(step)
        limit = self.cfg.trainer.save_total_limit
        for old in prune_checkpoints(self.run.run_dir, path, limit):
            log.info("checkpoint: removed %s (trainer.save_total_limit=%d)", old.name, limit)

    def restore(self, checkpoint: Path) -> None:
        """The trainers', RNGs' and counters' state of ``checkpoint``; training continues after its step."""
        log.info("resuming %s from %s", self.run.run_dir, checkpoint.name)
        state = load_state(checkpoint)
        for name, trainer in self.trainers.items():
            trainer.load_state_dict(state["trainers"][name])
        if self.critics is not None:
            self.critics.load_state_dict(state.get("critics") or {})
        if self.rewards is not None:
            self.rewards.load_state_dict(state.get("reward") or {})
        self.rng.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():  # what the GPUs sample with
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.counters.update(state.get("extra", {}))
        self.memory.update(state.get("algorithm") or {})
        self.start = self.step = state["step"]
        dropped = self.tracker.forget_after(self.start)
        if dropped:
            log.info("resume: dropped %d records of steps after %d from metrics.jsonl/samples.jsonl", dropped,
                     self.start)
        self.source.restored(self.start, state.get("in_flight"))

    def close(self, status: str) -> None:
        self.summary["status"] = status
        self.write_summary()
        self.tracker.finish(self.summary)
        self.source.close()
        log.info("run %s: %s after %d steps", self.run.run_dir, status, self.summary["steps"])

    def write_summary(self) -> None:
        if self.run.world.main:
            write_json(self.run.run_dir / "summary.json", self.summary)

    def _call(self, point: str, *args: Any) -> None:
        for hook in self.hooks:
            getattr(hook, point)(self, *args)

    def _summary(self) -> dict[str, Any]:
        cfg, run = self.cfg, self.run
        summary: dict[str, Any] = {
            "status": "running", "command": "train", "name": cfg.name, "run_dir": str(run.run_dir),
            "env": cfg.env.name, "workflow": cfg.workflow.name, "algorithm": cfg.algorithm.name,
            "regime": cfg.policy.name, "trainer_role": cfg.trainer.role, "steps": 0, "total_steps": cfg.trainer.steps,
            "policies": {n: p.roles for n, p in run.policies.items()}}
        path = run.run_dir / "summary.json"
        if self.checkpoint is not None and path.exists():
            summary.update(json.loads(path.read_text()), status="running")
        summary.update(run_provenance())  # this process, also on a resume
        if run.world.main:
            write_json(path, summary)
        return summary


def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run (or resume) one training run; return its summary (also written to ``summary.json``).

    ``build_run`` checks the config (``check_config``) before any file or model is made.
    """
    if not (cfg.model.name_or_path or cfg.trainer.warmstart.enabled or cfg.trainer.init_from or cfg.trainer.resume):
        log.warning("the model is the untrained tiny model and trainer.warmstart.enabled=false: it cannot write "
                    "the answer format, so RL has nothing to reinforce (experiment=embedded is a run that learns)")
    if cfg.trainer.resume:
        run_dir = Path(cfg.trainer.resume).resolve()
    run = build_run(cfg, run_dir)
    exchange = None
    if cfg.trainer.role != "all":
        subs = sub_roles(cfg, run.role_map)
        exchange = Exchange(build_store(cfg.store), cfg, run_dir, subs, run.role_map[subs[0]])
    return Trainer(run, row_source(run, exchange)).fit()
