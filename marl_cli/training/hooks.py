"""What the fit loop does around its steps: logging, periodic evaluation and checkpoints, as hooks.

The ``Trainer`` calls every hook, in order, ``on_start`` before its first step, ``on_step`` after each
step, ``on_end`` after the last and ``on_interrupt`` on Ctrl-C; a hook does its work through the
trainer's methods (``evaluate``, ``save``) and its tracker. What a hook sees of the trainer is ``FitLoop``
(so this module does not import the loop).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Protocol

from omegaconf import DictConfig
from tqdm import tqdm

from marl_cli.core.samples import Sample
from marl_cli.tracking.completions import completion_records
from marl_cli.tracking.console import draws_bars
from marl_cli.tracking.tracker import Tracker
from marl_cli.training.build import Run

log = logging.getLogger(__name__)
READABLE_ROWS = 4
"""Completions per agent written to ``samples.jsonl`` (training rows every ``log_completions_every`` steps;
at the final eval, every row of this many episodes)."""
STEP_LINE_KEYS = (("reward", "train/reward"), ("success", "train/success"))
STEP_LINE_POLICY_KEYS = ("loss", "kl_old", "entropy", "logprob_gap/mean")
STEP_LINE_CRITIC_KEYS = (("value_loss", "value_loss"), ("ev", "explained_variance"))


def step_line(step: int, steps: int, metrics: dict[str, float], policies: list[str],
              roles: tuple[str, ...] = ()) -> str:
    """One line of ``train.log`` for a logged step: reward, success, completion tokens per agent (mean and
    max), per-policy loss and diagnostics, each critic's value loss and explained variance, step time."""
    parts = [f"step {step}/{steps}"]
    parts += [f"{label} {metrics[key]:.4f}" for label, key in STEP_LINE_KEYS if key in metrics]
    lengths = [f"{role} {metrics[f'train/{role}/completion_tokens']:.1f} (max "
               f"{metrics.get(f'train/{role}/completion_tokens_max', 0.0):.0f})"
               for role in roles if f"train/{role}/completion_tokens" in metrics]
    if lengths:
        parts.append("tokens " + ", ".join(lengths))
    for name in policies:
        shown = [f"{k} {metrics[f'train/{name}/{k}']:.4g}" for k in STEP_LINE_POLICY_KEYS
                 if f"train/{name}/{k}" in metrics]
        if shown:
            parts.append(f"[{name}] " + " ".join(shown))
    for name in sorted({key.split("/")[1] for key in metrics if key.startswith("critic/")}):
        shown = [f"{label} {metrics[f'critic/{name}/{key}']:.4g}" for label, key in STEP_LINE_CRITIC_KEYS
                 if f"critic/{name}/{key}" in metrics]
        parts.append(f"[critic {name}] " + " ".join(shown))
    parts.append(f"{metrics['time/step_s']:.1f} s")
    return " | ".join(parts)


class FitLoop(Protocol):
    """What a hook sees of the trainer (``training/loop.py::Trainer``)."""

    cfg: DictConfig
    run: Run
    tracker: Tracker
    trainers: dict[str, Any]  # policy name -> its learner
    start: int  # the step the fit started after (a resume's checkpoint step, else 0)
    step: int  # the last completed step
    mid_step: bool  # the weights may hold part of an update

    def evaluate(self, prefix: str, step: int, readable: int = 0) -> dict[str, float]: ...

    def save(self, step: int) -> None: ...


class Hook:
    """A no-op at every point of the fit loop; subclasses override the points they act at."""

    def on_start(self, trainer: FitLoop) -> None:
        """Before the first step (after the warm start, ``eval_before`` and any resume)."""

    def on_step(self, trainer: FitLoop, step: int, metrics: dict[str, float], rows: list[Sample]) -> None:
        """After step ``step``, with its metrics and its rows as trained."""

    def on_end(self, trainer: FitLoop, step: int) -> None:
        """After the last step."""

    def on_interrupt(self, trainer: FitLoop) -> None:
        """On Ctrl-C (``trainer.step`` is the last completed step)."""


class LogHook(Hook):
    """Metrics every ``trainer.log_every`` steps (and the last) to metrics.jsonl/W&B and a line of train.log;
    readable completions every ``trainer.log_completions_every`` steps; the progress bar on a terminal, and
    where no bar is drawn (a pipe, a file, ``progress=false``) the step's line at every step."""

    def on_start(self, trainer: FitLoop) -> None:
        cfg = trainer.cfg
        self.bar = tqdm(total=cfg.trainer.steps, initial=trainer.start, desc=cfg.name,
                        disable=not draws_bars(cfg.progress, trainer.run.world.main), dynamic_ncols=True)

    def on_step(self, trainer: FitLoop, step: int, metrics: dict[str, float], rows: list[Sample]) -> None:
        cfg = trainer.cfg.trainer
        logged = step % cfg.log_every == 0 or step == cfg.steps
        if logged:
            trainer.tracker.log(step, metrics)
        if logged or self.bar.disable:
            log.info(step_line(step, cfg.steps, metrics, list(trainer.trainers), tuple(trainer.run.workflow.roles)))
        if cfg.log_completions_every and step % cfg.log_completions_every == 0:
            records = completion_records(rows, trainer.run.tokenizers(), step, "train", READABLE_ROWS,
                                         random.Random(step))
            trainer.tracker.log_samples(step, records, "train/samples")
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{metrics['train/reward']:.3f}", step_s=f"{metrics['time/step_s']:.1f}")

    def on_end(self, trainer: FitLoop, step: int) -> None:
        self.bar.close()


class EvalHook(Hook):
    """Greedy evaluation every ``trainer.eval_every`` steps and after the last (with readable rows)."""

    def on_step(self, trainer: FitLoop, step: int, metrics: dict[str, float], rows: list[Sample]) -> None:
        every = trainer.cfg.trainer.eval_every
        if every and step % every == 0 and step < trainer.cfg.trainer.steps:
            trainer.evaluate("eval", step)

    def on_end(self, trainer: FitLoop, step: int) -> None:
        trainer.evaluate("eval", step, READABLE_ROWS if trainer.cfg.trainer.log_completions_every else 0)


class CheckpointHook(Hook):
    """A checkpoint every ``every`` steps, after the last step, and of the last completed step when stopped
    (SIGINT/SIGTERM; see ``training/interrupts.py``)."""

    def __init__(self, every: int):
        self.every = every

    def on_step(self, trainer: FitLoop, step: int, metrics: dict[str, float], rows: list[Sample]) -> None:
        if self.every and step % self.every == 0 and step < trainer.cfg.trainer.steps:
            trainer.save(step)

    def on_end(self, trainer: FitLoop, step: int) -> None:
        trainer.save(step)

    def on_interrupt(self, trainer: FitLoop) -> None:
        if trainer.mid_step:
            log.warning("interrupted during step %d: not saved; a resume continues from the newest checkpoint",
                        trainer.step + 1)
        elif trainer.step > trainer.start:
            trainer.save(trainer.step)
