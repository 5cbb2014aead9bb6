"""A worked plug-in: the ``reverse`` environment (write a word backwards), registered from outside marl.

Load it with ``MARL_PLUGINS=examples/extending/reverse.py`` (or name a module of your package in the
``marl.plugins`` entry-point group) and point Hydra at ``examples/extending/conf`` with ``--config-dir``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from marl_cli.config.schema import EnvConfig, bounded
from marl_cli.envs.base import ENVS, Env, Transition

LETTERS = "abcdef"


@dataclass
class ReverseConfig(EnvConfig):
    """Reverse a random word: ``env=reverse`` (the YAML starts its defaults with ``base_reverse``)."""

    name: str = "reverse"
    length: int = bounded(4, ge=1)  # letters per word
    correct_reward: float = 1.0
    wrong_reward: float = 0.0
    format_penalty: float = -1.0  # no answer after the marker


@dataclass(frozen=True)
class Word:
    text: str
    answered: str | None = None


@ENVS.register("reverse", schema=ReverseConfig)
class ReverseEnv(Env):
    """One action per episode: the word backwards. The team reward is 1 when it is right."""

    def make_task(self, seed: int) -> str:
        rng = random.Random(seed)
        return "".join(rng.choice(LETTERS) for _ in range(self.cfg.length))

    def rules(self) -> str:
        return "Write the word backwards."

    def initial_state(self, task: str) -> Word:
        return Word(task)

    def observe(self, state: Word) -> str:
        return f"word: {state.text}"

    def step(self, state: Word, action: str | None) -> Transition:
        if action is None:
            return Transition(state, self.cfg.format_penalty, True, False, False)
        answer = action.strip()
        right = answer == state.text[::-1]
        reward = self.cfg.correct_reward if right else self.cfg.wrong_reward
        return Transition(Word(state.text, answer), reward, True, right, True)

    def score(self, state: Word) -> float:
        return float(state.answered == state.text[::-1])

    def oracle(self, state: Any) -> str:
        return state.text[::-1]
