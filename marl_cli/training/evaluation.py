"""Evaluation on an environment's held-out tasks: the periodic eval of training and ``marl eval``.

``evaluate`` plays each of the first ``size`` eval tasks ``samples`` times (one greedy episode, or n
sampled ones) and reports success (the mean over every episode, i.e. pass@1), pass@k with the
unbiased estimator 1 − C(n−c, k)/C(n, k) per task, and per-agent metrics. ``run_evaluation`` is the
``marl eval`` app: it loads the policies a run or checkpoint saved (or the model as configured),
evaluates them with the configured workflow, and writes ``summary.json`` in its own run dir.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from math import comb
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from marl_cli.core.samples import Sample
from marl_cli.policies.scripted import is_scripted, policy_name
from marl_cli.rollout.engine import Rollout, RolloutResult, rollout_metrics
from marl_cli.rollout.induced import induced_nash_conv
from marl_cli.tracking.completions import completion_records
from marl_cli.tracking.console import draws_bars
from marl_cli.tracking.tracker import Tracker, write_json
from marl_cli.training.build import Run, build_run
from marl_cli.training.league import play_league

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k of the n samples (c of them correct) is correct, drawn without replacement."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def play_tasks(run: Run, rollout: Rollout, tasks: list[Any], samples: int, prefix: str) -> RolloutResult:
    """``samples`` episodes of each task by ``rollout``, dealt to the run's processes and played in chunks of one
    generation batch (``rollout.batch_size`` episodes), with a progress bar when ``progress=true`` on a terminal."""
    chunk = max(1, rollout.sampling.batch_size // samples)

    def play(mine: list[Any]) -> RolloutResult:
        played = RolloutResult([], [], 0)
        with tqdm(total=len(mine), desc=prefix, unit="task", disable=not draws_bars(run.cfg.progress, run.world.main),
                  dynamic_ncols=True, leave=False) as bar:
            for first in range(0, len(mine), chunk):
                batch = mine[first:first + chunk]
                part = rollout.play(batch, samples)
                for item in (*part.episodes, *part.samples):
                    item.task += first
                played.episodes += part.episodes
                played.samples += part.samples
                bar.update(len(batch))
        return played

    return run.play(tasks, play)


def evaluate(run: Run, prefix: str = "eval", samples: int = 1, pass_k: tuple[int, ...] = (),
             rows: list[Sample] | None = None) -> dict[str, float]:
    """Success, pass@k and per-agent metrics of ``samples`` episodes on each of the first ``env.eval_size``
    eval tasks, played by ``run``'s policies (as routed now) with its eval sampling; a game adds each seat's
    outcomes, the exact NashConv (``env.nash_conv``) and the games against bots (``env.eval_opponents``).
    ``rows``, when given, receives every sample row played.
    """
    rollout = run.rollout.evaluation()
    workflow, size = rollout.workflow, run.cfg.env.eval_size
    start_time = time.perf_counter()
    tasks = [workflow.env.task("eval", i) for i in range(size)]
    played = play_tasks(run, rollout, tasks, samples, prefix)
    metrics = rollout_metrics(played, prefix, workflow)
    metrics.pop(f"{prefix}/generate_calls")
    metrics[f"{prefix}/tasks"] = float(size)
    metrics[f"{prefix}/{workflow.env.cfg.name}/success"] = metrics[f"{prefix}/success"]
    metrics.update(workflow.outcome_metrics([ep.state for ep in played.episodes], prefix))
    if OmegaConf.select(run.cfg, "env.nash_conv", default=False):
        names = workflow.env.names
        for kind, name in enumerate(names):
            metrics[f"{prefix}/nash_conv" + (f"/{name}" if len(names) > 1 else "")] = induced_nash_conv(rollout, kind)
    for bot in OmegaConf.select(run.cfg, "env.eval_opponents", default=None) or []:
        metrics.update(against(run, rollout, tasks, bot, prefix))
    if pass_k:
        correct: dict[int, int] = defaultdict(int)
        for ep in played.episodes:
            correct[ep.task] += int(ep.success)
        for k in pass_k:
            metrics[f"{prefix}/pass@{k}"] = sum(pass_at_k(samples, correct[t], k) for t in range(size)) / size
    if rows is not None:
        rows += played.samples
    log.info("%s: %d tasks x %d, success %.3f (%.1f s)", prefix, size, samples, metrics[f"{prefix}/success"],
             time.perf_counter() - start_time)
    return metrics


def against(run: Run, rollout: Rollout, tasks: list[Any], bot: str, prefix: str) -> dict[str, float]:
    """A game against ``bot``: for each seat a model plays, every other seat played by the bot, one game per task;
    that seat's outcomes as ``<prefix>/vs_<bot>/<seat>/win|draw|loss|...``."""
    metrics: dict[str, float] = {}
    roles = rollout.workflow.roles
    for role in roles:
        if is_scripted(rollout.routing[role]):
            continue
        routing = {**rollout.routing, **{other: policy_name(bot) for other in roles if other != role}}
        played = play_tasks(run, replace(rollout, routing=routing), tasks, 1, f"{prefix}/vs_{bot}")
        seat = rollout.workflow.outcome_metrics([ep.state for ep in played.episodes], f"{prefix}/vs_{bot}")
        metrics.update({k: v for k, v in seat.items() if k.startswith(f"{prefix}/vs_{bot}/{role}/")})
    return metrics


def run_evaluation(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """``marl eval``: evaluate the loaded (or configured) policies; return the summary (also ``summary.json``)."""
    pass_k = tuple(cfg.eval.pass_k)
    summary: dict[str, Any] = {"status": "running", "command": "eval", "name": cfg.name, "run_dir": str(run_dir),
                               "env": cfg.env.name, "workflow": cfg.workflow.name, "regime": cfg.policy.name,
                               "load": None, "samples": cfg.eval.samples, "temperature": cfg.eval.temperature}
    if cfg.eval.get("league"):
        return run_league(cfg, run_dir, summary)
    run = build_run(cfg, run_dir)
    loaded_run, checkpoint = run.source.loaded_run, run.source.checkpoint
    if checkpoint is not None:
        summary.update(load=str(checkpoint), loaded_run=str(loaded_run), loaded_step=int(checkpoint.name[5:]))
        saved_cfg = loaded_run / ".hydra" / "config.yaml"
        if saved_cfg.exists():
            summary["loaded_name"] = OmegaConf.load(saved_cfg).get("name")
    policies = run.policies
    summary["policies"] = {n: p.roles for n, p in policies.items()}
    write_json(run_dir / "summary.json", summary)

    def measured(tracker: Tracker) -> dict[str, float]:
        rows: list[Sample] = []
        metrics = evaluate(run, "eval", cfg.eval.samples, pass_k, rows)
        shown = ", ".join(f"{k.removeprefix('eval/')} {metrics[k]:.3f}" for k in
                          ["eval/success", *(f"eval/pass@{k}" for k in pass_k)])
        log.info("eval on %d %s tasks (%s): %s", cfg.env.eval_size, cfg.env.name, cfg.workflow.name, shown)
        tracker.log_samples(0, completion_records(rows, run.tokenizers(), 0, "eval", cfg.env.eval_size), "eval/samples")
        return metrics

    return recorded(cfg, run_dir, summary, measured)


def recorded(cfg: DictConfig, run_dir: Path, summary: dict[str, Any],
             measure: Callable[[Tracker], dict[str, float]]) -> dict[str, Any]:
    """``measure``'s metrics (it may also log completions to the tracker it is given) logged and added to ``summary``
    (status completed, or failed with the error), which is written to ``summary.json`` whatever happens; the
    summary."""
    tracker = Tracker(run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True), "eval")
    try:
        metrics = measure(tracker)
        tracker.log(0, metrics)
        summary.update(metrics, status="completed")
    except Exception as exc:
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        write_json(run_dir / "summary.json", summary)
        tracker.finish(summary)
    return summary


def run_league(cfg: DictConfig, run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """``marl eval eval.league=[...]``: the league's games and ratings (``training/league.py``) as the summary."""
    def play(run: Run, routing: dict[str, str]) -> list[Any]:
        """The final states of one pair's games on the held-out deals (the pair's seats as ``routing``)."""
        tasks = [run.workflow.env.task("eval", i) for i in range(cfg.env.eval_size)]
        run.rollout.routing = routing  # the backend starts what the seats act through
        return [ep.state for ep in play_tasks(run, run.rollout.evaluation(), tasks, 1, "league").episodes]

    summary["league"] = list(cfg.eval.league)
    return recorded(cfg, run_dir, summary, lambda _: play_league(cfg, run_dir, play))
