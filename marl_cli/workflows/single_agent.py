"""One agent reads the rendered state and answers with its action after the answer marker."""

from __future__ import annotations

from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.envs.base import Transition
from marl_cli.workflows.base import Workflow


class SingleAgentWorkflow(Workflow):
    """The degenerate workflow: one role, every turn; its reward is the environment's reward."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if len(self.roles) != 1:
            raise ConfigError(f"workflow=single_agent takes exactly one role, got {self.roles}")

    def turn_order(self, turn: int) -> list[str]:
        return self.roles

    def prompt(self, role: str, state: Any) -> str:
        return self.cfg.prompt.format(rules=self.env.rules(), observation=self.env.observe(state),
                                      marker=self.cfg.answer_marker)

    def act(self, role: str, state: Any, text: str) -> tuple[Transition, float]:
        transition = self.env.step(state, self.parse(text))
        return transition, transition.reward

    def demonstration(self, role: str, state: Any) -> str | None:
        answer = self.env.oracle(state)
        return None if answer is None else self.format_answer(answer)
