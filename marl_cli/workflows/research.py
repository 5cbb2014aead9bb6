"""Deep research workflows over the research env: a main agent with a tool-using sub-agent, or one agent.

Text protocol: every action is one line ``<tool>: <argument>`` (the last such line of the output
counts, so a model may think first). Main agent: ``call: <sub-task>`` hands a sub-task to the
sub-agent, ``answer: <answer>`` ends the episode. Sub-agent: ``search: <words>``, ``open: <doc id>``,
then ``result: <answer>`` returns to the main agent. The single agent (``solo``) has ``search``,
``open`` and ``answer``. An output without an allowed action is a format failure: it ends the
episode (main, solo) or the invocation (sub).

Rewards are M-GRPO's and are known only when the episode ends, so ``settle`` writes them into
every row of a trajectory: main R = α1 + α2·correct when the main agent's format is valid (every
action parsed and an answer given), else 0; sub R = β1 + β2·correct_main + β3·expert when the
invocation's format is valid (every action parsed and a result returned), else 0. ``expert`` is
the env's exact judgement of the result against the sub-task's target fact; where the env cannot
judge a sub-task (online questions), the expert share follows the main agent's correctness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ResearchWorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.envs.research import SEARCH_TOOLS
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

SUB_RULES = f"{SEARCH_TOOLS} result: <text> returns your finding to the main agent."
"""The sub-agent's ``{rules}``: its own tools (the env's rules end the episode with ``answer``, which a sub-agent
does not have)."""
_ACTION = re.compile(r"^[ \t]*(search|open|result|call|answer)[ \t]*:[ \t]*(\S[^\n]*?)[ \t]*$", re.I | re.M)


def parse_action(text: str, allowed: tuple[str, ...]) -> tuple[str, str] | None:
    """The last ``<tool>: <argument>`` line of ``text`` whose tool is ``allowed``, or None."""
    found = [(tool.lower(), arg) for tool, arg in _ACTION.findall(text) if tool.lower() in allowed]
    return found[-1] if found else None


@dataclass(frozen=True)
class Call:
    """One invocation of the sub-agent (for ``solo``: the agent's whole episode of tool use)."""

    subtask: str
    steps: tuple[tuple[str, str], ...] = ()  # (action line, tool observation)
    result: str | None = None
    format_ok: bool = True
    expert: float | None = None

    def history(self) -> str:
        return "\n".join(f"{action}\n=> {observation}" for action, observation in self.steps) or "none"


@dataclass(frozen=True)
class ResearchTeam(TeamState):
    """The team state: the env state, the finished sub-agent calls, and the one in progress."""

    calls: tuple[Call, ...] = ()
    active: Call | None = None
    main_ok: bool = True  # every main action so far parsed and stayed within budget


class ResearchWorkflow(Workflow):
    """What both research workflows share: tools, M-GRPO rewards and the closing of an episode."""

    trajectory_rewards = True

    def main_reward(self, format_ok: bool, correct: bool) -> float:
        """R_M = α1·format + α2·correct when the format is valid, else 0."""
        return self.cfg.main_format + self.cfg.main_correct * correct if format_ok else 0.0

    def sub_reward(self, format_ok: bool, main_correct: bool, expert: float | None) -> float:
        """R_S = β1·format + β2·correct_main + β3·expert when the format is valid, else 0."""
        if not format_ok:
            return 0.0
        judged = float(main_correct) if expert is None else expert
        return self.cfg.sub_format + self.cfg.sub_main_correct * main_correct + self.cfg.sub_expert * judged

    def use_tool(self, state: TeamState, tool: str, argument: str) -> str:
        """The observation of a ``search`` or ``open`` action on the task's knowledge source."""
        task = state.env.task
        return self.env.search(task, argument) if tool == "search" else self.env.open(task, argument)

    def answer(self, state: ResearchTeam, answer: str | None, format_ok: bool) -> Outcome:
        """The main agent's last action: an answer (scored by the env), or a format failure ending the episode."""
        if answer is None or not format_ok:
            return self.outcome(replace(state, done=True, main_ok=False), 0.0, False, team=0.0, solved=False)
        new, _, _, info = self.step_env(state, answer)
        return self.outcome(new, 0.0, True, info, team=0.0)

    def rescore(self, rows: list[Sample]) -> None:
        """The M-GRPO rewards of settled rows from their recorded format, correctness and expert components."""
        for row in rows:
            if "main_correct" in row.info:
                row.reward = self.sub_reward(row.info["format"] == 1.0, row.info["main_correct"] == 1.0,
                                             row.info.get("expert"))
            else:
                row.reward = self.main_reward(row.info["format"] == 1.0, row.info["correct"] == 1.0)

    def _closing(self, state: ResearchTeam, rows: list[Sample], main_roles: set[str]) -> None:
        correct = bool(state.success)
        main_ok = state.main_ok and state.env.answer is not None
        main_r = self.main_reward(main_ok, correct)
        calls = list(state.calls) + ([replace(state.active, format_ok=False)] if state.active else [])
        for row in rows:
            if row.role in main_roles:
                row.reward, row.success = main_r, correct
                row.info.update(format=float(main_ok), correct=float(correct))
                continue
            call = calls[row.segment]
            ok = call.format_ok and call.result is not None
            row.reward = self.sub_reward(ok, correct, call.expert)
            row.success = call.expert == 1.0
            row.info.update(format=float(ok), main_correct=float(correct), expert_judged=float(call.expert is not None))
            if call.expert is not None:
                row.info["expert"] = call.expert


@WORKFLOWS.register("deep_research", schema=ResearchWorkflowConfig)
class DeepResearchWorkflow(ResearchWorkflow):
    """M-GRPO's hierarchy: the main agent plans and calls the sub-agent, which searches and reads.

    Roles: ``roles[0]`` is the main agent, ``roles[1]`` the sub-agent. In every engine turn exactly one
    of them acts in an episode (the main agent waits while a call is in progress), so a turn batches
    the main agents of some episodes with the sub-agents of others. Each call is one sub-trajectory
    (``segment`` = its index); their number per rollout varies.
    """

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if len(self.roles) != 2:
            raise ConfigError(f"workflow=deep_research takes two roles (main, sub), got {self.roles}")
        self.main, self.sub = self.roles
        for key in ("max_calls", "sub_turns"):
            if cfg[key] < 1:
                raise ConfigError(f"workflow.{key} must be at least 1, got {cfg[key]}")

    def initial_state(self, task: Any) -> ResearchTeam:
        return ResearchTeam(self.env.initial_state(task))

    def stages(self, turn: int) -> list[list[str]]:
        return [[self.main, self.sub]]

    def acting(self, role: str, state: TeamState) -> bool:
        return (state.active is None) == (role == self.main)

    def segment(self, role: str, state: TeamState) -> int:
        return len(state.calls) if role == self.sub else 0

    def prompt(self, role: str, state: TeamState) -> str:
        if role == self.main:
            findings = "\n".join(f"{c.subtask} -> {c.result if c.result is not None else 'no result'}"
                                 for c in state.calls) or "none"
            return self.render(role, state, {"findings": findings})
        return self.render(role, state, {"rules": SUB_RULES, "subtask": state.active.subtask,
                                         "history": state.active.history()})

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        if role == self.main:
            return self._act_main(state, text)
        return self._act_sub(state, text)

    def _act_main(self, state: ResearchTeam, text: str) -> Outcome:
        action = parse_action(text, ("call", "answer"))
        if action is None or action[0] == "answer":
            return self.answer(state, action and action[1], action is not None)
        if len(state.calls) >= self.cfg.max_calls:  # over budget: the episode ends without an answer
            return self.answer(state, None, False)
        return self.outcome(replace(state, active=Call(action[1])), 0.0, True, team=0.0)

    def _act_sub(self, state: ResearchTeam, text: str) -> Outcome:
        call = state.active
        action = parse_action(text, ("search", "open", "result"))
        if action is None:
            return self._finish(state, replace(call, format_ok=False), False)
        tool, argument = action
        if tool == "result":
            expert = self.env.expert(state.env.task, call.subtask, argument)
            return self._finish(state, replace(call, result=argument, expert=expert), True)
        call = replace(call, steps=(*call.steps, (f"{tool}: {argument}", self.use_tool(state, tool, argument))))
        if len(call.steps) >= self.cfg.sub_turns:  # no action left for the result
            return self._finish(state, replace(call, format_ok=False), True)
        return self.outcome(replace(state, active=call), 0.0, True, team=0.0)

    def _finish(self, state: ResearchTeam, call: Call, format_ok: bool) -> Outcome:
        new = replace(state, calls=(*state.calls, call), active=None)
        return self.outcome(new, 0.0, format_ok, team=0.0, solved=call.expert == 1.0)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        self._closing(state, rows, {self.main})

    def demonstration(self, role: str, state: TeamState) -> str | None:
        task = state.env.task
        if not task.hops:
            return None
        if role == self.main:
            i = len(state.calls)
            return f"call: {task.hops[i].subtask}" if i < len(task.hops) else f"answer: {task.answer}"
        return _oracle_tool_use(self.env, task, state.active.subtask, len(state.active.steps), "result")


@WORKFLOWS.register("solo_research", schema=ResearchWorkflowConfig)
class SoloResearchWorkflow(ResearchWorkflow):
    """The single-agent baseline: one agent with every tool (search, open, answer) and the main reward.

    ``max_calls`` bounds its search/open actions per episode; one more ends it without an answer.
    """

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if len(self.roles) != 1:
            raise ConfigError(f"workflow=solo_research takes exactly one role, got {self.roles}")

    def initial_state(self, task: Any) -> ResearchTeam:
        return ResearchTeam(self.env.initial_state(task), active=Call(task.question))

    def prompt(self, role: str, state: TeamState) -> str:
        return self.render(role, state, {"history": state.active.history()})

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        action = parse_action(text, ("search", "open", "answer"))
        if action is None or action[0] == "answer":
            return self.answer(state, action and action[1], action is not None)
        if len(state.active.steps) >= self.cfg.max_calls:
            return self.answer(state, None, False)
        tool, argument = action
        call = replace(state.active, steps=(*state.active.steps,
                                            (f"{tool}: {argument}", self.use_tool(state, tool, argument))))
        return self.outcome(replace(state, active=call), 0.0, True, team=0.0)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        self._closing(replace(state, active=None), rows, set(self.roles))

    def demonstration(self, role: str, state: TeamState) -> str | None:
        task = state.env.task
        n = len(state.active.steps)
        if not task.hops:
            return None
        if n >= 2 * len(task.hops):
            return f"answer: {task.answer}"
        return _oracle_tool_use(self.env, task, task.hops[n // 2].subtask, n % 2, "answer")


def _oracle_tool_use(env: Any, task: Any, subtask: str, done: int, final: str) -> str | None:
    """The oracle's next action on ``subtask`` after ``done`` actions: search it, open its subject, state the fact."""
    if done == 0:
        return f"search: {subtask}"
    if done == 1:
        doc = env.doc_id(task, subtask.split(" of ", 1)[-1])
        return None if doc is None else f"open: {doc}"
    fact = env.subtask_answer(task, subtask)
    return None if fact is None else f"{final}: {fact}"
