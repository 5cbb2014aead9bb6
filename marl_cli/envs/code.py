"""Code: write a Python program that reads stdin and prints the answer (AT-GRPO paper, coding family).

An action is a program (a fenced block in it is taken if there is one). It runs in the sandbox on the
problem's first ``max_tests`` ground-truth tests; a test passes when the program exits cleanly within the
limits and its stdout equals the expected output after stripping, line by line with runs of whitespace
collapsed. ``p_gt`` is the share of tests passed: the action's reward, the state's score, and success
exactly when it is 1 (which ends the episode). No code at all is a format failure (``format_penalty``;
the team's previous program stays). The last action ends the episode.

The state also carries the tests a tester agent wrote (``workflow=code_test``); the environment never
reads them. Problems come from ``env.train`` / ``env.eval`` (see ``code_data``): ``task(split, i)`` takes
problem ``i`` modulo the split's list, the training list in an order shuffled by the run seed.
"""

from __future__ import annotations

import logging
import random
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import CodeConfig
from marl_cli.envs.base import ENVS, Env, Transition
from marl_cli.envs.code_data import (
    PASSED,
    Problem,
    ProblemSet,
    Test,
    load_problems,
    normalize,
    passes,
    test_program,
)

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n?(.*?)```", re.DOTALL)
CACHE_SIZE = 20_000
"""Runs remembered by (program, stdin); the cache is emptied when it fills."""
CACHED_OUTPUT = 4096
"""Longer outputs are not cached."""


def clean_code(text: str | None) -> str | None:
    """The program in ``text``: its last fenced block if it has one, else all of it; None when empty."""
    if text is None:
        return None
    blocks = _FENCE.findall(text)
    code = (blocks[-1] if blocks else text).strip()
    return code or None


@dataclass(frozen=True)
class Run:
    """What one program printed on one input (normalised) and whether it finished cleanly."""

    ok: bool
    output: str
    timed_out: bool = False

    def matches(self, expected: str) -> bool:
        return self.ok and self.output == normalize(expected)


@dataclass(frozen=True)
class CodeState:
    """The problem, the team's current program and its ground-truth pass rate, and the tester's tests."""

    problem: Problem
    code: str | None = None
    tests: tuple[Test, ...] = ()
    p_gt: float = 0.0
    actions: int = 0
    done: bool = False
    success: bool = False


@ENVS.register("code", schema=CodeConfig)
class CodeEnv(Env):
    """stdin→stdout programming problems scored on ground-truth tests in the sandbox."""

    runs_code = True

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        if cfg.max_tests < 1:
            raise ConfigError(f"env.max_tests must be at least 1, got {cfg.max_tests}")
        self.sets: dict[str, ProblemSet] = {where: load_problems(getattr(cfg, where), where)
                                            for where in ("train", "eval")}
        kinds = {where: {p.function for p in s.problems} for where, s in self.sets.items()}
        if len(kinds["train"] | kinds["eval"]) > 1:
            raise ConfigError("env.train and env.eval mix function problems (humaneval, mbpp) with stdin→stdout "
                              "ones; give both splits sources of one kind")
        self.function = True in kinds["train"]
        self.marker = f"{PASSED}{secrets.token_hex(8)}"  # unknown to the answers (see code_data.PASSED)
        if self.function and sandbox is not None:
            for where in ("train", "eval"):
                self.sets[where] = self._golden_passing(self.sets[where], where, sandbox)
        self.train_problems = self.sets["train"].problems
        self.eval_problems = self.sets["eval"].problems
        self._order = list(range(len(self.train_problems)))
        random.Random(seed).shuffle(self._order)
        if cfg.eval_size > len(self.eval_problems):
            log.warning("env.eval_size=%d but the eval source has %d problems; some are evaluated twice",
                        cfg.eval_size, len(self.eval_problems))
        if {p.statement for p in self.train_problems} & {p.statement for p in self.eval_problems}:
            log.warning("env: some train and eval problems share a statement (the same source for both?)")
        self._cache: dict[tuple[str, str], Run] = {}

    def _golden_passing(self, found: ProblemSet, where: str, sandbox: Any) -> ProblemSet:
        """The problems whose golden program passes its own tests (function sources: a broken check or golden
        would score every answer wrong); the others are skipped, counted and logged."""
        jobs = [(p, t, test_program(p, p.solution, t, self.marker)) for p in found.problems if p.solution
                for t in p.tests]
        results = sandbox.run_many([job for _, _, job in jobs])
        failing = {problem.id for (problem, test, _), result in zip(jobs, results, strict=True)
                   if not passes(problem, normalize(result.stdout), result.ok, test, self.marker)}
        if failing:
            log.warning("env.%s: skipped %d problems of %s whose golden program fails its own tests", where,
                        len(failing), found.source)
        kept = [p for p in found.problems if p.id not in failing]
        if not kept:
            raise ConfigError(f"env.{where}: no problem of {found.source} has a golden program passing its tests")
        skipped = {**found.skipped, "golden fails its tests": len(failing)} if failing else found.skipped
        return ProblemSet(kept, skipped, found.source)

    # -- tasks -----------------------------------------------------------------------------------

    def task(self, split: str, index: int) -> Problem:
        """Eval problem ``index`` (modulo the list), or a training problem in the run's shuffled order."""
        if split == "eval":
            return self.eval_problems[index % len(self.eval_problems)]
        if split not in ("train", "warmstart"):
            raise ValueError(f"unknown split {split!r}; expected train, warmstart or eval")
        return self.train_problems[self._order[index % len(self._order)]]

    def make_task(self, seed: int) -> Problem:
        return self.train_problems[seed % len(self.train_problems)]

    def rules(self) -> str:
        if self.function:
            return "Write the Python 3 function asked for; it is checked by assertions."
        return "Write a Python 3 program that reads standard input and prints the answer."

    def initial_state(self, task: Problem) -> CodeState:
        return CodeState(problem=task)

    def observe(self, state: CodeState) -> str:
        return state.problem.statement

    def oracle(self, state: CodeState) -> str | None:
        return state.problem.solution

    def score(self, state: CodeState) -> float:
        return state.p_gt

    def ground_truth(self, problem: Problem) -> tuple[Test, ...]:
        """The tests a program is scored on: the problem's first ``max_tests``."""
        return problem.tests[: self.cfg.max_tests]

    # -- running programs ------------------------------------------------------------------------

    def run_jobs(self, jobs: list[tuple[str, str]]) -> list[Run]:
        """Run ``(program, stdin)`` pairs, each distinct pair once and all in one sandbox batch."""
        if self.sandbox is None:
            raise ConfigError("env=code runs programs and needs a sandbox")
        todo = list(dict.fromkeys(job for job in jobs if job not in self._cache))
        if len(self._cache) + len(todo) > CACHE_SIZE:
            self._cache.clear()
        fresh = dict(zip(todo, self.sandbox.run_many(todo), strict=True))
        done: dict[tuple[str, str], Run] = {}
        for job, result in fresh.items():
            run = Run(result.ok, normalize(result.stdout), result.timed_out)
            done[job] = run
            if not run.timed_out and len(run.output) <= CACHED_OUTPUT:  # a timeout may be load, not the program
                self._cache[job] = run
        return [done[job] if job in done else self._cache[job] for job in jobs]

    def step(self, state: CodeState, action: str | None) -> Transition:
        return self.step_many([(state, action)])[0]

    def step_many(self, pairs: list[tuple[CodeState, str | None]]) -> list[Transition]:
        """``step`` for many (state, action) pairs, with every program run in one sandbox batch."""
        codes = [clean_code(action) for _, action in pairs]
        jobs = [test_program(state.problem, code, test, self.marker)
                for (state, _), code in zip(pairs, codes, strict=True) if code is not None
                for test in self.ground_truth(state.problem)]
        runs = iter(self.run_jobs(jobs))
        return [self._transition(state, code, runs) for (state, _), code in zip(pairs, codes, strict=True)]

    def _transition(self, state: CodeState, code: str | None, runs: Any) -> Transition:
        actions = state.actions + 1
        last = actions >= self.cfg.actions_per_episode
        if code is None:
            new = replace(state, actions=actions, done=last)
            return Transition(new, self.cfg.format_penalty, done=new.done, success=new.success, format_ok=False,
                              info={"p_gt": state.p_gt, "timeouts": 0.0, "errors": 0.0})
        tests = self.ground_truth(state.problem)
        mine = [next(runs) for _ in tests]
        passed = sum(passes(state.problem, run.output, run.ok, test, self.marker)
                     for run, test in zip(mine, tests, strict=True))
        p_gt = passed / len(tests)
        success = p_gt == 1.0
        done = success or last
        new = replace(state, code=code, p_gt=p_gt, actions=actions, done=done, success=success)
        info = {"p_gt": p_gt, "timeouts": sum(r.timed_out for r in mine) / len(tests),
                "errors": sum(not r.ok and not r.timed_out for r in mine) / len(tests)}
        return Transition(new, p_gt, done=done, success=success, format_ok=True, info=info)
