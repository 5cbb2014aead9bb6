"""The AT-GRPO math workflow: a tool agent writes Python, then a reasoner answers in ``\\boxed{}``.

Each turn the ``tool`` agent writes Python; it runs in the sandbox and the last line it prints is
the tool's answer. That answer is checked against the gold answer on a *copy* of the state: the
real environment is unchanged (the answer lives only in the tool's note, shown to the reasoner),
so only the reasoner's answers use up the episode's actions. The ``reasoner`` then answers; the
last ``\\boxed{...}`` in its text (else the text after the answer marker) is applied to the real
environment. The episode ends when the reasoner is right (success), when its answer equals the
tool's printed answer (Math-Verify equality, even if both are wrong), or after ``max_turns`` turns.

Rewards, each ``alpha · team + local`` (paper: tool {+1, 0, −1} + team, reasoner 2·1[correct]):

- tool: local = the env's reward for its printed answer (+1 correct, 0 wrong, −1 = ``format_penalty``
  when the code is missing, fails, times out or prints nothing readable, which is a format failure);
  team = 1 when that answer is correct.
- reasoner: local = the env's reward for its answer (+1 / 0 / −1 unreadable); team = 1 when correct,
  so a correct reasoner earns 2 at alpha = 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.envs.math_problems import MathEnv, answers_match, extract_answer
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

TOOL_ERROR = "error"
"""The tool's note when its code gave no answer (missing, crashed, timed out or printed nothing)."""


def printed_answer(stdout: str) -> str | None:
    """The answer in the last non-empty line a program printed, or None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return extract_answer(lines[-1]) if lines else None


@WORKFLOWS.register("tool_reason", schema=WorkflowConfig)
class ToolReasonWorkflow(Workflow):
    """``tool`` (Python, scored on a copy) then ``reasoner`` (applied to the real environment)."""

    runs_code = True

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if self.roles != ["tool", "reasoner"]:
            raise ConfigError(f"workflow=tool_reason has the roles [tool, reasoner] in that order, got {self.roles}")
        if not isinstance(env, MathEnv):
            raise ConfigError(f"workflow=tool_reason works with env=math, got env={env.cfg.name}")

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        return self.act_many(role, [(state, text)])[0]

    def act_many(self, role: str, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        if role == "reasoner":
            return [self._reason(state, text) for state, text in jobs]
        outcomes = []
        for (state, _), run in zip(jobs, self.run_code([text for _, text in jobs]), strict=True):
            answer = printed_answer(run.stdout) if run is not None and run.ok else None
            sim = self.env.step(state.env, answer)
            info = {**sim.info, "code_error": float(run is not None and not run.ok),
                    "timed_out": float(run is not None and run.timed_out), "no_code": float(run is None)}
            outcomes.append(self.outcome(state.with_note("tool", answer if sim.format_ok else TOOL_ERROR),
                                         sim.reward, sim.format_ok, info, team=self.env.score(sim.state),
                                         solved=sim.success))
        return outcomes

    def answer(self, text: str) -> str | None:
        """The reasoner's answer: the last ``\\boxed{...}``, else the text after the answer marker."""
        return extract_answer(text if "\\boxed" in text else self.parse(text))

    def _reason(self, state: TeamState, text: str) -> Outcome:
        answer = self.answer(text)
        new, reward, format_ok, info = self.step_env(state, answer)
        tool = state.notes.get("tool", TOOL_ERROR)
        agreed = format_ok and answer is not None and tool != TOOL_ERROR and answers_match(tool, answer)
        if agreed:
            new = replace(new, done=True)
        info = {**info, "agreed": float(agreed)}
        note = answer if format_ok and answer is not None else "none"
        return self.outcome(new.with_note("reasoner", note), reward, format_ok, info)

    def demonstration(self, role: str, state: TeamState) -> str | None:
        answer = self.env.oracle(state.env)
        if answer is None:
            return None
        if role == "tool":
            return self.format_answer(f"print({answer!r})")
        return f"\\boxed{{{answer}}}"
