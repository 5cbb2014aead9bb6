"""An OpenEnv environment shipped with marl for its tests and toy run: guess a secret whole number, with feedback.

A real ``openenv`` Environment with its own Action, Observation and State types. ``reset(seed=...)`` draws the
secret from 1..``top`` with ``random.Random(seed)``; each guess (the Action's one text field, ``guess``) is
answered ``higher``, ``lower`` or ``correct``, and the observation's ``low``/``high`` bound what the secret can
still be. Rewards: 1.0 for the secret (it ends the episode), 0.0 for another whole number from 1 to ``top``, -0.5
for anything else (the environment reads the text itself); every guess uses one of ``max_guesses``, and the last
one ends the episode. ``midpoint`` is a policy from the observation alone (binary search), for warm starts.

Train on it in-process::

    marl train experiment=envs/openenv_guess_number

or serve it with the library's own server and train against that::

    python -m uvicorn --factory guess_number:make_app --app-dir examples/openenv_envs --port 8000
    marl train experiment=envs/openenv_guess_number env.environment= env.oracle= env.base_url=http://127.0.0.1:8000
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

RULES = ("Guess the secret whole number. After each guess you are told whether the secret is higher or lower; "
         "low and high bound what it can still be. Answer with one whole number.")
WHOLE = re.compile(r"[+-]?\d{1,9}")


class GuessAction(Action):
    """One guess, as text: the environment reads the number itself."""

    guess: str = Field(..., description="the guess: one whole number")


class GuessObservation(Observation):
    """What the guesser is told after a reset or a guess."""

    feedback: str = Field(default="", description="higher, lower, correct, or why the guess was not read")
    low: int = Field(default=1, description="the smallest number the secret can still be")
    high: int = Field(default=1, description="the largest number the secret can still be")
    guesses_left: int = Field(default=0, description="guesses left in this episode")


class GuessState(State):
    """The episode: the secret and what the guesser has learnt of it."""

    secret: int = 0
    low: int = 1
    high: int = 1
    guesses_left: int = 0
    found: bool = False


def read_guess(text: str, top: int) -> int | None:
    """The whole number from 1 to ``top`` that ``text`` is (surrounding spaces allowed), or None."""
    text = text.strip()
    if not WHOLE.fullmatch(text):
        return None
    number = int(text)
    return number if 1 <= number <= top else None


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    """Guess a secret number from 1 to ``top`` in at most ``max_guesses`` guesses."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, top: int = 16, max_guesses: int = 4):
        super().__init__()
        if top < 1 or max_guesses < 1:
            raise ValueError(f"top and max_guesses must be at least 1, got {top} and {max_guesses}")
        self.top = top
        self.max_guesses = max_guesses
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        secret = random.Random(seed).randint(1, self.top)
        self._state = GuessState(episode_id=episode_id or str(uuid4()), secret=secret, low=1, high=self.top,
                                 guesses_left=self.max_guesses)
        return self._observe(f"guess a whole number from 1 to {self.top}", reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        state = self._state
        if state.guesses_left == 0 or state.found:
            return self._observe("the episode is over", reward=0.0, done=True)
        state.step_count += 1
        state.guesses_left -= 1
        guess = read_guess(action.guess, self.top)
        if guess is None:
            feedback, reward = f"not a whole number from 1 to {self.top}", -0.5
        elif guess == state.secret:
            feedback, reward = "correct", 1.0
            state.low = state.high = guess
            state.found = True
        elif guess < state.secret:
            feedback, reward = "higher", 0.0
            state.low = max(state.low, guess + 1)
        else:
            feedback, reward = "lower", 0.0
            state.high = min(state.high, guess - 1)
        return self._observe(feedback, reward=reward, done=state.found or state.guesses_left == 0)

    def _observe(self, feedback: str, reward: float, done: bool) -> GuessObservation:
        s = self._state
        return GuessObservation(feedback=feedback, low=s.low, high=s.high, guesses_left=s.guesses_left,
                                reward=reward, done=done)

    @property
    def state(self) -> GuessState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="guess_number", description=RULES, version="1.0.0")


def midpoint(observation: dict[str, Any]) -> str:
    """Binary search: the middle of the range the secret can still be in (an observation's public fields)."""
    return str((observation["low"] + observation["high"]) // 2)


def make_app(top: int = 16, max_guesses: int = 4, sessions: int = 8) -> Any:
    """The library's FastAPI app serving this environment (``uvicorn --factory``), ``sessions`` at once."""
    from openenv.core.env_server.http_server import create_app

    return create_app(functools.partial(GuessNumberEnvironment, top=top, max_guesses=max_guesses), GuessAction,
                      GuessObservation, max_concurrent_envs=sessions)
