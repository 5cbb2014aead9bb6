"""The workflow interface: which roles act in which turn, what each sees, and how answers parse."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.envs.base import Env, Transition


class Workflow(ABC):
    """Agents (roles), their prompts and the turn order, over one environment.

    A workflow never calls a model: the rollout engine asks it for prompts, hands back the
    generated text, and records what it returns.
    """

    def __init__(self, cfg: Any, env: Env):
        self.cfg = cfg
        self.env = env
        self.roles: list[str] = list(cfg.roles)
        if not self.roles:
            raise ConfigError("workflow.roles must name at least one role")
        if cfg.max_turns < 1:
            raise ConfigError(f"workflow.max_turns must be at least 1, got {cfg.max_turns}")
        self.max_turns: int = cfg.max_turns

    def parse(self, text: str) -> str | None:
        """The answer after the last ``answer_marker``, or None when there is none."""
        marker = self.cfg.answer_marker
        if marker not in text:
            return None
        answer = text.rsplit(marker, 1)[1].strip()
        return answer or None

    def format_answer(self, answer: str) -> str:
        """The completion that states ``answer`` in this workflow's format (used for demonstrations)."""
        return f"{self.cfg.answer_marker} {answer}"

    @abstractmethod
    def turn_order(self, turn: int) -> list[str]:
        """The roles that act in ``turn``, in order."""

    @abstractmethod
    def prompt(self, role: str, state: Any) -> str:
        """The prompt ``role`` sees in ``state``."""

    @abstractmethod
    def act(self, role: str, state: Any, text: str) -> tuple[Transition, float]:
        """Apply ``role``'s generated ``text`` to ``state``: the transition and the role's reward."""

    @abstractmethod
    def demonstration(self, role: str, state: Any) -> str | None:
        """An oracle completion for ``role`` in ``state`` (for the warm start), or None."""
