"""The AT-GRPO planning workflow (Sudoku, Sokoban, Plan-Path): a tool agent, then a plan agent.

Each turn the ``tool`` agent writes Python that prints an action (a move list, a grid); the code
runs in the sandbox and its printed action is simulated on a copy of the state, which scores the
tool agent without changing the real environment. The ``plan`` agent then sees the tool's printed
output and gives the action that is applied to the real environment. Code that fails to run, or
prints nothing the environment can parse, is a format failure with the environment's penalty.
"""

from __future__ import annotations

from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow


@WORKFLOWS.register("tool_plan", schema=WorkflowConfig)
class ToolPlanWorkflow(Workflow):
    """``tool`` (Python, simulated on a copy) then ``plan`` (applied to the real environment)."""

    runs_code = True

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if self.roles != ["tool", "plan"]:
            raise ConfigError(f"workflow=tool_plan has the roles [tool, plan] in that order, got {self.roles}")

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        return self.act_many(role, [(state, text)])[0]

    def act_many(self, role: str, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        if role == "plan":
            return [self._plan(state, text) for state, text in jobs]
        outcomes = []
        for (state, _), run in zip(jobs, self.run_code([text for _, text in jobs]), strict=True):
            printed = run.stdout.strip() if run is not None and run.ok else None
            sim = self.env.step(state.env, printed or None)
            note = printed if printed else ("no code" if run is None else "error")
            info = {**sim.info, "code_error": float(run is not None and not run.ok)}
            outcomes.append(self.outcome(state.with_note("tool", note[-400:]), sim.reward, sim.format_ok, info,
                                         team=self.env.score(sim.state), solved=sim.success))
        return outcomes

    def _plan(self, state: TeamState, text: str) -> Outcome:
        answer = self.parse(text)
        new, reward, format_ok, info = self.step_env(state, answer)
        return self.outcome(new.with_note("plan", answer or "none"), reward, format_ok, info)

    def demonstration(self, role: str, state: TeamState) -> str | None:
        answer = self.env.oracle(state.env)
        if answer is None:
            return None
        if role == "tool":
            return self.format_answer(f"print({answer!r})")
        return self.format_answer(answer)
