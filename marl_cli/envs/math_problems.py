"""Math: answer a question with a number or expression (AT-GRPO paper, mathematical reasoning family).

A task is a question and its gold answer, from the embedded generator or a dataset (``math_data``;
``env.train`` and ``env.eval`` pick a source each, so one can train on Polaris and evaluate on
AIME 2024). An action is the answer text: the last ``\\boxed{...}`` in it, or else the whole text.
Correctness is decided by Math-Verify (``1/2``, ``0.5`` and ``\\frac{1}{2}`` are equal; so are
``2x+1`` and ``1+2x``). A correct answer pays ``correct_reward`` and ends the episode (success); a
wrong one pays ``wrong_reward``; no answer, or one Math-Verify cannot read, pays ``format_penalty``.
The action that uses the last of ``actions_per_episode`` ends the episode either way.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import MathConfig
from marl_cli.envs.base import ENVS, EVAL_SEED_BASE, WARMSTART_OFFSET, Env, Transition, task_seed
from marl_cli.envs.math_data import (
    KINDS,
    SHAPES,
    MathTask,
    exact_value,
    fraction_text,
    generate,
    held_out,
    in_kinds,
    load_tasks,
)
from marl_cli.envs.sources import load_splits

MAX_ANSWER_CHARS = 300
"""Longer answers are not read (a format failure): they are not answers, and parsing them is slow."""
_BOXES = ("\\boxed", "\\fbox")
_MATH_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")
BARE_NUMBER = re.compile(r"[+-]?\d(?:[\d\s,.]*\d)?")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = max(text.rfind(box) for box in _BOXES)
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0 or text[start:brace].strip() not in _BOXES:
        return None
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1:i].strip()
    return None


def extract_answer(text: str | None) -> str | None:
    """The answer in ``text``: its last ``\\boxed{...}``, else the text itself; None when there is none.

    A ``\\boxed`` whose braces do not close gives None, as does an answer over ``MAX_ANSWER_CHARS``.
    """
    if text is None:
        return None
    answer = last_boxed(text) if any(box in text for box in _BOXES) else text
    if answer is None:
        return None
    answer = answer.strip().strip("$").strip().rstrip(".").strip()
    return answer if answer and len(answer) <= MAX_ANSWER_CHARS else None


def _timeout() -> int | None:
    """Math-Verify's timeouts use SIGALRM, which only the main thread may set; elsewhere run without."""
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=8192)
def parse_math(text: str) -> tuple[Any, ...]:
    """Math-Verify's reading of ``text``; empty when unreadable. A bare number (``1 000``, ``1,000``, ``-2.5``)
    is read as text, so its separators stay separators (as LaTeX math ``1 000`` would be 1·0 and ``1,22`` a
    set); other bare answers (``2\\sqrt{2}``, ``x^2+1``) are read as LaTeX math."""
    from math_verify import parse

    try:
        if BARE_NUMBER.fullmatch(text.strip()):
            found = parse(text, fallback_mode="no_fallback", parsing_timeout=_timeout())
            if found:
                return tuple(found)
        wrapped = text if any(d in text for d in _MATH_DELIMITERS) else f"${text}$"
        found = parse(wrapped, fallback_mode="no_fallback", parsing_timeout=_timeout())
        if not found:
            found = parse(text, fallback_mode="no_fallback", parsing_timeout=_timeout())
    except Exception:  # a pathological expression: treat it as unreadable
        return ()
    return tuple(found)


def _normal(text: str) -> str:
    return "".join(text.split()).lower()


def answers_match(gold: str, answer: str) -> bool:
    """Whether ``answer`` equals ``gold`` mathematically (Math-Verify), or textually when gold is not math."""
    from math_verify import verify

    parsed_gold, parsed = parse_math(gold), parse_math(answer)
    if not parsed_gold or not parsed:
        return _normal(gold) == _normal(answer)
    try:
        return bool(verify(list(parsed_gold), list(parsed), timeout_seconds=_timeout()))
    except Exception:
        return False


MAX_PROPOSED = 80
"""The longest expression a proposer may write (``MathEnv.parse_task``)."""


@dataclass(frozen=True)
class MathState:
    """The task, the team's latest answer (None before any, or after an unreadable one) and the episode so far."""

    task: MathTask
    answer: str | None = None
    correct: bool = False
    actions: int = 0
    done: bool = False


@ENVS.register("math", schema=MathConfig)
class MathEnv(Env):
    """Question answering with a Math-Verify checker; the oracle is the gold answer."""

    def __init__(self, cfg: MathConfig, seed: int = 0, sandbox: object = None):
        super().__init__(cfg, seed, sandbox)
        if cfg.max_operand < 2:
            raise ConfigError(f"env.max_operand must be at least 2, got {cfg.max_operand}")
        self.kinds = list(cfg.kinds)
        unknown = [k for k in self.kinds if k not in KINDS]
        if not self.kinds or unknown:
            raise ConfigError(f"env.kinds must name some of {', '.join(KINDS)}, got {self.kinds}")
        if cfg.proposals == "kinds" and not any(k in SHAPES for k in self.kinds):
            raise ConfigError(f"env.proposals=kinds: no kind of env.kinds={self.kinds} is a bare expression a "
                              f"proposer can write (those are: {', '.join(SHAPES)})")
        self.datasets = load_splits(cfg, load_tasks)
        train = self.datasets["train"]
        self.order = None if train is None else random.Random(seed).sample(range(len(train)), len(train))

    def task(self, split: str, index: int) -> MathTask:
        """Task ``index`` of ``split``: generated from its seed, or a row of the split's dataset.

        Dataset rows are taken modulo the dataset's length; training (and warm-start) rows in an order
        shuffled by the run seed, evaluation rows in file order.
        """
        seed = task_seed(split, index, self.seed)
        rows = self.datasets["eval" if split == "eval" else "train"]
        if rows is None:
            return self.make_task(seed)
        if split == "eval":
            return rows[index % len(rows)]
        if split == "warmstart":
            index += WARMSTART_OFFSET
        assert self.order is not None
        return rows[self.order[index % len(rows)]]

    def make_task(self, seed: int) -> MathTask:
        return generate(seed, self.cfg.max_operand, self.kinds, holdout=seed >= EVAL_SEED_BASE)

    def rules(self) -> str:
        return "Answer the math question with a number or an expression."

    def initial_state(self, task: MathTask) -> MathState:
        return MathState(task=task)

    def observe(self, state: MathState) -> str:
        return state.task.question

    def oracle(self, state: MathState) -> str | None:
        return state.task.answer

    def score(self, state: MathState) -> float:
        return 1.0 if state.correct else 0.0

    writes_tasks = True

    def parse_task(self, text: str) -> MathTask | None:
        """``<expression>`` or ``<expression> = <answer>``: an integer expression (``+ - * /``, parentheses, at least
        one operator, every number at most ``env.max_operand``, at most ``MAX_PROPOSED`` characters); the program
        computes its exact value, and a stated answer must be it. With ``env.proposals=kinds`` it must also have the
        shape of a question ``env.kinds`` generates (``add_sub``: ``a + b`` or ``a - b``, never negative). The
        question must lie on the training side of the embedded generator's split (a held-out question is refused,
        so a proposer cannot write an evaluation question); anything else is not a task."""
        head, sep, stated = text.strip().rpartition("=")
        expr = (head if sep else stated).strip()
        if len(expr) > MAX_PROPOSED or "**" in expr or "//" in expr or not re.search(r"\d\s*[+\-*/]", expr):
            return None  # `**` would let a proposal run for ever; `//` is not the family's division
        if any(int(n) > self.cfg.max_operand for n in re.findall(r"\d+", expr)):
            return None
        try:
            value = fraction_text(exact_value(expr))  # refuses (ValueError) anything but integers and + - * / ( )
        except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
            return None
        if sep and not answers_match(value, stated.strip()):
            return None
        expr = " ".join(re.sub(r"([+\-*/()])", r" \1 ", expr).split())
        if self.cfg.proposals == "kinds" and not in_kinds(expr, self.kinds, self.cfg.max_operand):
            return None
        question = f"What is {expr}?"
        return None if held_out(question) else MathTask(question, value, expr)  # the eval side is never trained on

    def write_task(self, task: MathTask) -> str | None:
        """The expression alone: the program computes its answer."""
        return task.expr if task.expr and task.question.startswith("What is ") else None

    def check(self, state: MathState, answer: str) -> bool:
        """Whether ``answer`` (already extracted) is the task's gold answer."""
        return answers_match(state.task.answer, answer)

    def step(self, state: MathState, action: str | None) -> Transition:
        cfg = self.cfg
        actions = state.actions + 1
        last = actions >= cfg.actions_per_episode
        answer = extract_answer(action)
        if answer is None or not parse_math(answer):
            new = replace(state, answer=None, correct=False, actions=actions, done=last)
            return Transition(new, cfg.format_penalty, done=last, success=False, format_ok=False,
                              info={"correct": 0.0})
        correct = self.check(state, answer)
        done = correct or last
        new = MathState(task=state.task, answer=answer, correct=correct, actions=actions, done=done)
        return Transition(new, cfg.correct_reward if correct else cfg.wrong_reward, done=done, success=correct,
                          format_ok=True, info={"correct": float(correct)})
