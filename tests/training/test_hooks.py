"""The fit loop's hooks on their own: log, eval and checkpoint cadence, seen through a fake trainer."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from omegaconf import OmegaConf

from marl_cli.training.hooks import READABLE_ROWS, CheckpointHook, EvalHook, FitLoop, LogHook


class FakeTrainer:
    """What a hook sees of the trainer (``FitLoop``), recording every evaluation, checkpoint and logged step."""

    def __init__(self, steps: int, log_every: int = 1, eval_every: int = 0, completions_every: int = 0):
        trainer = {"steps": steps, "log_every": log_every, "eval_every": eval_every,
                   "log_completions_every": completions_every}
        self.cfg = OmegaConf.create({"trainer": trainer, "name": "fake", "progress": False})
        self.run = SimpleNamespace(world=SimpleNamespace(main=True), workflow=SimpleNamespace(roles=["agent"]),
                                   tokenizers=lambda: {})
        self.logged: list[int] = []
        self.samples: list[int] = []
        self.tracker = SimpleNamespace(log=lambda step, metrics: self.logged.append(step),
                                       log_samples=lambda step, records, key: self.samples.append(step))
        self.trainers: dict = {}
        self.start = self.step = 0
        self.mid_step = False
        self.evals: list[tuple[str, int, int]] = []
        self.saves: list[int] = []

    def evaluate(self, prefix: str, step: int, readable: int = 0) -> dict[str, float]:
        self.evals.append((prefix, step, readable))
        return {}

    def save(self, step: int) -> None:
        self.saves.append(step)


def _fit(trainer: FakeTrainer, hooks: list, steps: int) -> None:
    """Drive the hooks as ``Trainer.fit`` does."""
    for hook in hooks:
        hook.on_start(trainer)
    for step in range(trainer.start + 1, steps + 1):
        trainer.step = step
        for hook in hooks:
            hook.on_step(trainer, step, {"train/reward": 0.5, "time/step_s": 0.1}, [])
    for hook in hooks:
        hook.on_end(trainer, trainer.step)


def test_the_fake_trainer_is_what_hooks_see():
    assert isinstance(FakeTrainer(1), FakeTrainer)  # a structural match: FitLoop has no runtime check
    assert {"cfg", "run", "tracker", "evaluate", "save"} <= set(FitLoop.__annotations__) | set(dir(FitLoop))


def test_eval_every_n_steps_and_once_after_the_last():
    trainer = FakeTrainer(steps=7, eval_every=3, completions_every=1)
    _fit(trainer, [EvalHook()], 7)
    assert trainer.evals == [("eval", 3, 0), ("eval", 6, 0), ("eval", 7, READABLE_ROWS)]
    quiet = FakeTrainer(steps=4)  # eval_every=0: only the final eval, without readable rows
    _fit(quiet, [EvalHook()], 4)
    assert quiet.evals == [("eval", 4, 0)]


def test_checkpoint_every_n_steps_at_the_end_and_on_interrupt():
    trainer = FakeTrainer(steps=5)
    _fit(trainer, [CheckpointHook(2)], 5)
    assert trainer.saves == [2, 4, 5]
    never = FakeTrainer(steps=3)
    _fit(never, [CheckpointHook(0)], 3)
    assert never.saves == [3]  # every=0: only the last step
    stopped = FakeTrainer(steps=5)
    stopped.step = 2
    CheckpointHook(0).on_interrupt(stopped)
    assert stopped.saves == [2]
    stopped.mid_step = True  # the weights may hold part of an update: nothing is saved
    CheckpointHook(0).on_interrupt(stopped)
    assert stopped.saves == [2]
    resumed = FakeTrainer(steps=5)
    resumed.start = resumed.step = 2  # nothing completed since the resume: nothing new to save
    CheckpointHook(0).on_interrupt(resumed)
    assert resumed.saves == []


def test_log_every_n_steps_and_the_last_with_completions_on_their_cadence(caplog):
    trainer = FakeTrainer(steps=5, log_every=2, completions_every=3)
    with caplog.at_level(logging.INFO, logger="marl_cli.training.hooks"):
        _fit(trainer, [LogHook()], 5)
    assert trainer.logged == [2, 4, 5]
    assert trainer.samples == [3]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" |")[0] for line in lines] == [f"step {s}/5" for s in range(1, 6)]  # no bar: every step
