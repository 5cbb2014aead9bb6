"""The workflow interface: which roles act when, what each sees, how answers parse and score.

A turn is a list of *stages*. The roles of one stage act in parallel: all of them are prompted
from the state the stage starts in (so one policy serving several of them generates for all in one
call). Their actions are then applied in stage order, each on the state left by the previous
role's chosen action. A workflow with one role per stage is sequential.

Every agent's reward is ``α · team + local``: ``local`` scores the agent's own action and ``team``
is the environment's score of the state the action leads to (``Env.score``: 1 when solved).
"""

from __future__ import annotations

import random
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.core.samples import Sample
from marl_cli.envs.base import EVAL_SEED_BASE, Env
from marl_cli.sandbox import SandboxResult


def check_rewards(cfg: Any) -> None:
    """A workflow rewarded per trajectory trains with a hierarchical algorithm (M-GRPO's alignment)."""
    if WORKFLOWS.get(cfg.workflow.name).trajectory_rewards and not ALGORITHMS.get(cfg.algorithm.name).hierarchical:
        raise ConfigError(f"workflow={cfg.workflow.name} rewards whole trajectories; train it with algorithm=m_grpo")


WORKFLOWS: Registry[type[Workflow]] = Registry("workflow.name", "workflow", check=check_rewards)
"""Workflows by name; a class registers itself with ``@WORKFLOWS.register(name, schema=..., check=...)``."""
_FENCE = re.compile(r"```(?:python|py)?\s*\n?(.*?)```", re.DOTALL)


def extract_code(text: str, marker: str) -> str | None:
    """The code in ``text``: the last fenced block, else what follows the last ``marker`` (an empty marker: all of
    ``text``); None if empty."""
    blocks = _FENCE.findall(text)
    if blocks:
        code = blocks[-1]
    elif not marker:
        code = text
    elif marker in text:
        code = text.rsplit(marker, 1)[1]
    else:
        return None
    code = code.strip()
    return code or None


@dataclass(frozen=True)
class TeamState:
    """What the agents share: the environment state and each role's latest contribution."""

    env: Any
    notes: Mapping[str, str] = field(default_factory=dict)
    done: bool = False
    success: bool = False

    def with_note(self, role: str, text: str) -> TeamState:
        return replace(self, notes={**self.notes, role: text})


@dataclass
class Outcome:
    """One candidate action of one agent: the state it leads to and the agent's reward for it.

    ``solved``: whether the agent's own action solves the task; for an action simulated on a copy
    (a tool agent's) that is the simulation's verdict, while ``success`` is the shared state's.
    """

    state: TeamState
    reward: float
    local: float
    team: float
    format_ok: bool
    info: dict[str, float] = field(default_factory=dict)
    solved: bool = False

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def success(self) -> bool:
        return self.state.success


class Workflow(ABC):
    """Agents (roles), their prompts and the turn order, over one environment.

    A workflow never calls a model: the rollout engine asks it for prompts, hands back the
    generated text, and records the outcomes it returns.
    """

    runs_code: bool = False
    """Whether this class executes model-written code (then the run builds a sandbox for it)."""
    trajectory_rewards: bool = False
    """Whether rewards exist only per trajectory (written by ``settle``), so groups must be trajectories too."""
    once: tuple[str, ...] = ()
    """Roles that act once per task, before its K episodes part (independent rollouts): one generation, one row, its
    outcome the starting point of every episode of the task (a proposer writing the task the others then solve)."""
    train_only: tuple[str, ...] = ()
    """Roles that act in training rollouts only: evaluations skip them (a proposer; evaluation tasks are the env's)."""

    def __init__(self, cfg: Any, env: Env):
        self.cfg = cfg
        self.env = env
        self.roles: list[str] = list(cfg.roles)
        if not self.roles:
            raise ConfigError("workflow.roles must name at least one role")
        if len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"workflow.roles must be distinct, got {self.roles}")
        if cfg.max_turns < 1:
            raise ConfigError(f"workflow.max_turns must be at least 1, got {cfg.max_turns}")
        self.max_turns: int = cfg.max_turns
        self.alpha: float = cfg.alpha
        if self.runs_code and env.sandbox is None:
            raise ConfigError(f"workflow={cfg.name} runs model-written code and needs a sandbox")

    def initial_state(self, task: Any) -> TeamState:
        return TeamState(self.env.initial_state(task))

    def render(self, role: str, state: TeamState, extra: Mapping[str, str] | None = None,
               template: str | None = None) -> str:
        """``template`` (by default ``role``'s: ``workflow.prompts[role]`` or ``workflow.prompt``) filled from
        ``state``.

        Fields: ``{rules}``, ``{observation}``, ``{marker}``, ``{role}``, for every role ``{<role>}``:
        that role's latest note (``none`` before it has acted), and the workflow's ``extra`` fields.
        """
        if template is None:
            template = self.cfg.prompts.get(role, self.cfg.prompt)
        fields = {r: "none" for r in self.roles}
        fields.update(state.notes)
        fields.update(rules=self.env.rules(), observation=self.env.observe(state.env), marker=self.cfg.answer_marker,
                      role=role)
        fields.update(extra or {})
        try:
            return template.format_map(fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"workflow prompt of role {role!r} has a bad field {exc}; fields: "
                              f"{', '.join(sorted(fields))}") from exc

    def parse(self, text: str) -> str | None:
        """The answer after the last ``answer_marker`` (an empty marker: the whole reply); None when there is none."""
        marker = self.cfg.answer_marker
        if not marker:
            return text.strip() or None
        if marker not in text:
            return None
        answer = text.rsplit(marker, 1)[1].strip()
        return answer or None

    def format_answer(self, answer: str) -> str:
        """The completion that states ``answer`` in this workflow's format (used for demonstrations)."""
        return f"{self.cfg.answer_marker} {answer}" if self.cfg.answer_marker else answer

    def outcome(self, state: TeamState, local: float, format_ok: bool, info: dict[str, float] | None = None,
                team: float | None = None, solved: bool | None = None) -> Outcome:
        """Score a candidate: ``α · team + local``, with ``team`` the env's score of ``state`` by default."""
        if team is None:
            team = self.env.score(state.env)
        return Outcome(state, self.alpha * team + local, local, team, format_ok, dict(info or {}),
                       state.success if solved is None else solved)

    def step_env(self, state: TeamState, action: str | None) -> tuple[TeamState, float, bool, dict[str, float]]:
        """Apply ``action`` to the real environment: the new team state, env reward, format flag, info."""
        t = self.env.step(state.env, action)
        return replace(state, env=t.state, done=t.done, success=t.success), t.reward, t.format_ok, t.info

    def run_code(self, texts: list[str]) -> list[SandboxResult | None]:
        """Run the code of each text (``extract_code``) in one sandbox batch; None where a text has no code."""
        codes = [extract_code(text, self.cfg.answer_marker) for text in texts]
        runs = iter(self.env.sandbox.run_many([(code, "") for code in codes if code is not None]))
        return [None if code is None else next(runs) for code in codes]

    def act_many(self, role: str, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        """``act`` for many (state, text) pairs; workflows that run code override it to run them concurrently."""
        return [self.act(role, state, text) for state, text in jobs]

    def stages(self, turn: int) -> list[list[str]]:
        """The stages of ``turn``: one stage per role, in role order (sequential) unless overridden."""
        return [[role] for role in self.roles]

    def prompt(self, role: str, state: TeamState) -> str:
        """The prompt ``role`` sees in ``state``: its template rendered from the state."""
        return self.render(role, state)

    def once_per_task(self, role: str, state: TeamState) -> bool:
        """Whether ``role``'s action in ``state`` is its one action for every episode of the task (``once``: a
        proposer's; a judge grading the proposal, not the answers, decides it per state)."""
        return role in self.once

    def practice_states(self, role: str, state: TeamState) -> list[TeamState]:
        """States beside ``state`` in which the warm start also teaches ``role``'s demonstration, without playing
        them (none by default; a judge is shown wrong answers as well as the oracle's right ones)."""
        return []

    def another_task(self, state: TeamState) -> Any:
        """Another training-side task of the env's family, drawn from ``state``'s text (the same text, the same
        task): demonstrations that must differ from what the state shows."""
        seed = zlib.crc32(self.env.observe(state.env).encode())
        return self.env.make_task(random.Random(seed).randrange(EVAL_SEED_BASE))

    def wrong_answer(self, state: TeamState) -> str | None:
        """An answer the env's program rejects in ``state`` (the oracle's answer to ``another_task``), or None when
        that one is right."""
        other = self.env.oracle(self.env.initial_state(self.another_task(state)))
        if other is None or self.env.step(state.env, other).success:
            return None
        return other

    def step_metrics(self, rows: list[Sample], prefix: str) -> dict[str, float]:
        """Metrics of a rollout's rows beyond the per-agent ones (none by default; a judged workflow logs its
        judge's agreement with the program)."""
        return {}

    def acting(self, role: str, state: TeamState) -> bool:
        """Whether ``role`` acts in ``state`` when its stage comes (always, unless a workflow decides per state)."""
        return True

    def segment(self, role: str, state: TeamState) -> int:
        """Which of ``role``'s trajectories in the episode its next action belongs to (0 unless it has several)."""
        return 0

    def rescore(self, rows: list[Sample]) -> None:
        """Recompute the rewards of settled ``rows`` from the components ``settle`` recorded in their ``info``.

        A decoupled trainer that receives another process's rows scores them with its own config.
        By default rewards have no recorded components and stay as they are.
        """
        return

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """Write rewards known only when the episode is over into its ``rows``; ``state`` is its final state.

        By default rewards are final when an action is scored, and the rows stay as they are.
        """
        return

    def settle_task(self, finals: list[TeamState], rows: list[Sample]) -> None:
        """Write rewards that depend on every episode of one task into its ``rows`` (all its episodes'), once each
        episode is settled; ``finals`` are its episodes' final states. By default nothing."""
        return

    def outcome_metrics(self, finals: list[TeamState], prefix: str) -> dict[str, float]:
        """Metrics of an evaluation's episodes, from their final states, beyond success and the per-agent ones (none
        by default; a game reports each seat's wins, draws and losses)."""
        return {}

    @abstractmethod
    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        """Apply ``role``'s generated ``text`` to ``state`` (never mutated) and score it."""

    @abstractmethod
    def demonstration(self, role: str, state: TeamState) -> str | None:
        """An oracle completion for ``role`` in ``state`` (for the warm start), or None."""
