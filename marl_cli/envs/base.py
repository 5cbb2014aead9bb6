"""The environment interface every task family implements, the seed rule for its splits, and what the adapters of
outside libraries share (their settings as plain Python, the library's use of Python's global generator undone)."""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry

EVAL_SEED_BASE = 1_000_000_000
"""Evaluation tasks use seeds ``EVAL_SEED_BASE + i``; training seeds always lie below it."""

WARMSTART_OFFSET = 500_000_000
"""Warm-start demonstrations use training indices from here on, so they differ from RL tasks."""


def task_seed(split: str, index: int, run_seed: int) -> int:
    """The seed of task ``index`` of ``split`` ("train", "warmstart" or "eval").

    Evaluation seeds do not depend on the run seed, so every run is scored on the same held-out
    tasks; training seeds do, and are disjoint from evaluation seeds by construction.
    """
    if split == "eval":
        return EVAL_SEED_BASE + index
    if split == "warmstart":
        index += WARMSTART_OFFSET
    elif split != "train":
        raise ValueError(f"unknown split {split!r}; expected train, warmstart or eval")
    return (run_seed * 1_000_003 + index) % EVAL_SEED_BASE


ENVS: Registry[type[Env]] = Registry("env.name", "env")
"""Environments by name; a class registers itself with ``@ENVS.register(name, schema=...)``."""


@dataclass
class Transition:
    """The result of applying one parsed action to a state."""

    state: Any
    reward: float
    done: bool
    success: bool
    format_ok: bool
    info: dict[str, float] = field(default_factory=dict)


class Env(ABC):
    """A task family: task generation, state, transition rules, scoring and an oracle.

    Environments know nothing about models or tokenisation: they take and return text. States are
    immutable: ``step`` returns a new state, so a candidate action can be scored on the current
    state without disturbing it. An episode accepts ``cfg.actions_per_episode`` actions; the one
    that uses the last of them ends the episode (``done``) even when the task is unsolved.
    ``sandbox`` runs model-written code for families that execute it (code tests, tool agents).
    """

    runs_code: bool = False
    """Whether this class executes model-written code (then the run builds a sandbox for it)."""

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        self.cfg = cfg
        self.seed = seed
        self.sandbox = sandbox
        if cfg.actions_per_episode < 1:
            raise ConfigError(f"env.actions_per_episode must be at least 1, got {cfg.actions_per_episode}")

    @classmethod
    def uses_sandbox(cls, cfg: Any) -> bool:
        """Whether an env of this class configured by ``cfg`` runs model-written code (``runs_code`` unless a
        setting decides it)."""
        return cls.runs_code

    def task(self, split: str, index: int) -> Any:
        """Task ``index`` of ``split``, deterministic from the run seed."""
        return self.make_task(task_seed(split, index, self.seed))

    @abstractmethod
    def make_task(self, seed: int) -> Any:
        """The task generated from ``seed``."""

    @abstractmethod
    def rules(self) -> str:
        """The rules of the game as shown to an agent."""

    @abstractmethod
    def initial_state(self, task: Any) -> Any:
        """The state an episode on ``task`` starts from."""

    @abstractmethod
    def observe(self, state: Any) -> str:
        """A text rendering of ``state``."""

    @abstractmethod
    def step(self, state: Any, action: str | None) -> Transition:
        """Apply ``action`` (the answer text; None when the answer could not be parsed)."""

    @abstractmethod
    def score(self, state: Any) -> float:
        """How close ``state`` is to solved, in [0, 1] and 1 exactly when solved (the team reward)."""

    @abstractmethod
    def oracle(self, state: Any) -> str | None:
        """An optimal action from ``state`` as answer text, or None when there is none."""

    writes_tasks: bool = False
    """Whether a model may write this family's tasks (``parse_task`` and ``write_task`` are implemented): a
    proposer's text becomes a task only through the family's own validity check."""

    def parse_task(self, text: str) -> Any | None:
        """The task a proposer wrote in ``text`` if it is a valid task of this family (a program checks it: it
        parses, it can be solved, its stated answer is right), else None."""
        return None

    def write_task(self, task: Any) -> str | None:
        """``task`` as a proposer writes it (``parse_task`` reads it back), or None; for demonstrations."""
        return None


@dataclass(frozen=True)
class AnswerState:
    """A task answered once per action: the latest answer (None before any, or after an unreadable one), the share
    of the task it got right (the state's score) and the episode so far."""

    task: Any
    answer: str | None = None
    score: float = 0.0
    actions: int = 0
    done: bool = False


def answer_step(state: AnswerState, answer: str | None, share: float | None, cfg: Any, reward: float,
                info: dict[str, float]) -> Transition:
    """The transition of ``answer`` scored ``share`` of the task, paid ``reward`` (None: unreadable, a format failure
    paying ``cfg.format_penalty``). A share of 1 solves the task and ends the episode, as does the
    ``cfg.actions_per_episode``-th answer."""
    actions = state.actions + 1
    last = actions >= cfg.actions_per_episode
    if share is None:
        new = replace(state, answer=None, score=0.0, actions=actions, done=last)
        return Transition(new, cfg.format_penalty, done=last, success=False, format_ok=False, info=info)
    solved = share == 1.0
    new = replace(state, answer=answer, score=share, actions=actions, done=solved or last)
    return Transition(new, reward, done=new.done, success=solved, format_ok=True, info=info)


def plain(value: Any) -> Any:
    """``value`` as plain Python (an OmegaConf node becomes dicts and lists)."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


@contextlib.contextmanager
def own_random() -> Iterator[None]:
    """Python's global generator as it was before a library reseeded or drew from it."""
    saved = random.getstate()
    try:
        yield
    finally:
        random.setstate(saved)
