"""One agent reads the rendered state and answers with its action after the answer marker."""

from __future__ import annotations

from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow


@WORKFLOWS.register("single_agent", schema=WorkflowConfig)
class SingleAgentWorkflow(Workflow):
    """The degenerate workflow: one role, every turn; its local reward is the environment's reward."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if len(self.roles) != 1:
            raise ConfigError(f"workflow=single_agent takes exactly one role, got {self.roles}")

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        new, reward, format_ok, info = self.step_env(state, self.parse(text))
        return self.outcome(new, reward, format_ok, info)

    def demonstration(self, role: str, state: TeamState) -> str | None:
        answer = self.env.oracle(state.env)
        return None if answer is None else self.format_answer(answer)
