"""The AT-GRPO coding workflow: a coder and a tester act in parallel each turn (``env=code``).

One stage per turn holds both roles, so both are prompted from the state the turn starts in: the coder
sees the tester's latest tests, the tester the coder's latest program (``{tester}`` / ``{coder}``; the
previous turn's). The coder's program is applied first (run on the ground-truth tests); the tester is then
scored against the program the coder's chosen candidate left in the state.

Tester format: after the answer marker, one test per line, ``input => expected output``, with ``\\n`` for a
line break inside either side (``2\\n3 4 => 7``). Lines without ``=>`` are ignored; no test at all is a
format failure. At most ``env.max_tests`` tests are kept.

Rewards (each ``alpha · team + local``, team = ``p_gt`` of the team's current program):

- coder: local = ``p_gt`` of its program (the share of ground-truth tests it passes), so 2·p_gt at
  alpha 1 as in the paper; no code is a format failure with ``env.format_penalty``.
- tester: local = ``p_golden + w · agreement`` with ``w = tester_agreement_weight``. ``p_golden`` is the
  share of its tests the golden program passes (the paper's term). ``agreement`` is the share of its
  *valid* tests (those the golden program passes) whose verdict on the coder's current program matches
  the truth: a valid test "agrees" when it passes the program and the program is correct (p_gt = 1), or
  fails it and the program is wrong. So it rewards tests that catch a wrong program and accept a right one.
  It is 0 when there is no program yet or no valid test. ``w = 0`` gives the paper's ``p_golden + p_gt``.
  Problems without a golden program (LiveCodeBench) give ``p_golden = agreement = 0`` (constant within a
  group, so no gradient either way). Unparsable tests are a format failure with ``env.format_penalty``.

The episode ends (done) after the tester's act when the coder's current program passes every test the
tester just wrote (at least one), or when the episode's actions are used up; success = p_gt == 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import CodeTestConfig
from marl_cli.envs.code import CodeEnv, CodeState, Run
from marl_cli.envs.code_data import Test
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow, extract_code

NOTE_CHARS = 800
"""Longest note (program or tests) shown to the other agent; longer ones keep their start."""
DEMO_TESTS = 3
"""Ground-truth tests in a tester demonstration (the shortest ones)."""


def _escape(text: str) -> str:
    return text.rstrip("\n").replace("\n", "\\n")


def format_tests(tests: list[Test] | tuple[Test, ...]) -> str:
    """Tests in the tester's format, one ``input => output`` line each."""
    return "\n".join(f"{_escape(stdin)} => {_escape(out)}" for stdin, out in tests)


def parse_tests(answer: str | None, limit: int) -> tuple[Test, ...]:
    """The distinct ``input => output`` lines of ``answer`` as (stdin, expected stdout), at most ``limit``."""
    tests: list[Test] = []
    for line in (answer or "").splitlines():
        if "=>" not in line:
            continue
        stdin, _, out = (part.strip().replace("\\n", "\n") for part in line.partition("=>"))
        test = (stdin + "\n" if stdin else "", out + "\n" if out else "")
        if test not in tests:
            tests.append(test)
        if len(tests) >= limit:
            break
    return tuple(tests)


@WORKFLOWS.register("code_test", schema=CodeTestConfig)
class CodeTestWorkflow(Workflow):
    """``coder`` ∥ ``tester`` in one parallel stage per turn, over ``env=code``."""

    runs_code = True

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if self.roles != ["coder", "tester"]:
            raise ConfigError(f"workflow=code_test has the roles [coder, tester] in that order, got {self.roles}")
        if not isinstance(env, CodeEnv):
            raise ConfigError(f"workflow=code_test works with env=code, got env={env.cfg.name}")
        if env.function:
            raise ConfigError("workflow=code_test's tester writes stdin→stdout tests; function problems "
                              "(env.*.source=humaneval|mbpp) train with workflow=single_agent")
        self.agreement_weight = float(getattr(cfg, "tester_agreement_weight", 1.0))
        if self.agreement_weight < 0:
            raise ConfigError(f"workflow.tester_agreement_weight must be non-negative, got {self.agreement_weight}")
        self.env: CodeEnv = env

    def stages(self, turn: int) -> list[list[str]]:
        return [list(self.roles)]

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        return self.act_many(role, [(state, text)])[0]

    def act_many(self, role: str, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        return self._coder(jobs) if role == "coder" else self._tester(jobs)

    # -- coder -----------------------------------------------------------------------------------

    def _coder(self, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        codes = [extract_code(text, self.cfg.answer_marker) for _, text in jobs]
        steps = self.env.step_many([(state.env, code) for (state, _), code in zip(jobs, codes, strict=True)])
        outcomes = []
        for (state, _), t in zip(jobs, steps, strict=True):
            # The stage goes on to the tester: only its act may end the episode.
            new = replace(state, env=t.state, done=False, success=t.success)
            new = new.with_note("coder", (t.state.code or "none")[:NOTE_CHARS])
            outcomes.append(self.outcome(new, t.reward, t.format_ok, t.info))
        return outcomes

    # -- tester ----------------------------------------------------------------------------------

    def _tester(self, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        limit = self.env.cfg.max_tests
        all_tests = [parse_tests(self.parse(text), limit) for _, text in jobs]
        runs: list[tuple[str, str]] = []
        for (state, _), tests in zip(jobs, all_tests, strict=True):
            env: CodeState = state.env
            for program in (env.problem.solution, env.code):
                if program is not None:
                    runs += [(program, stdin) for stdin, _ in tests]
        results = iter(self.env.run_jobs(runs))
        return [self._score_tests(state, tests, results) for (state, _), tests in zip(jobs, all_tests, strict=True)]

    def _score_tests(self, state: TeamState, tests: tuple[Test, ...], results: Any) -> Outcome:
        env: CodeState = state.env
        out_of_actions = env.actions >= self.env.cfg.actions_per_episode
        if not tests:
            new = replace(state, done=out_of_actions, success=env.success)
            return self.outcome(new, self.env.cfg.format_penalty, False,
                                {"p_golden": 0.0, "agreement": 0.0, "tests": 0.0, "early_stop": 0.0})
        golden: list[Run] | None = None if env.problem.solution is None else [next(results) for _ in tests]
        mine: list[Run] | None = None if env.code is None else [next(results) for _ in tests]
        valid = [golden is not None and golden[i].matches(out) for i, (_, out) in enumerate(tests)]
        passes = [mine is not None and mine[i].matches(out) for i, (_, out) in enumerate(tests)]
        p_golden = sum(valid) / len(tests)
        correct = env.p_gt == 1.0
        judged = [passes[i] == correct for i in range(len(tests)) if valid[i]]
        agreement = sum(judged) / len(judged) if judged and env.code is not None else 0.0
        early_stop = env.code is not None and all(passes)
        new = replace(state, env=replace(env, tests=tests), done=early_stop or out_of_actions, success=env.success)
        new = new.with_note("tester", format_tests(tests)[:NOTE_CHARS])
        info = {"p_golden": p_golden, "agreement": agreement, "tests": float(len(tests)),
                "early_stop": float(early_stop)}
        return self.outcome(new, p_golden + self.agreement_weight * agreement, True, info)

    # -- warm start ------------------------------------------------------------------------------

    def demonstration(self, role: str, state: TeamState) -> str | None:
        env: CodeState = state.env
        if role == "coder":
            return None if env.problem.solution is None else self.format_answer(env.problem.solution)
        shortest = sorted(self.env.ground_truth(env.problem), key=lambda t: len(t[0]) + len(t[1]))[:DEMO_TESTS]
        return self.format_answer(format_tests(shortest))
