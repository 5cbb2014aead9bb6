"""Deep research workflows: the text protocol, the main/sub hierarchy, M-GRPO rewards, batching in the engine."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.algorithms.mgrpo import mgrpo_advantages
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ResearchConfig, ResearchWorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.envs.research import ResearchEnv
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.workflows.research import DeepResearchWorkflow, SoloResearchWorkflow, parse_action
from tests.helpers import ScriptedGenerator

PROMPTS = {"main": "{observation}\nFindings:\n{findings}\n", "sub": "{rules}\nTask: {subtask}\n{history}\n"}


def _env() -> ResearchEnv:
    return ResearchEnv(OmegaConf.structured(ResearchConfig(people=12, organisations=4, cities=4, countries=3,
                                                           min_hops=2, max_hops=2)))


def _deep(**overrides) -> DeepResearchWorkflow:
    cfg = ResearchWorkflowConfig(name="deep_research", roles=["main", "sub"], max_turns=20, prompts=PROMPTS)
    return DeepResearchWorkflow(OmegaConf.structured(replace(cfg, **overrides)), _env())


def _solo() -> SoloResearchWorkflow:
    cfg = ResearchWorkflowConfig(name="solo_research", roles=["agent"], max_turns=10, max_calls=8,
                                 prompt="{rules}\n{observation}\n{history}\n")
    return SoloResearchWorkflow(OmegaConf.structured(cfg), _env())


def _row(role: str, segment: int = 0) -> Sample:
    return Sample(0, 0, 0, role, role, [1], [2], 0.0, segment=segment)


def _play(workflow, state, answer):
    """Play one episode with ``answer(role, state)``; return the final state and one row per action."""
    rows = []
    for _ in range(workflow.max_turns):
        if state.done:
            break
        role = next(r for r in workflow.roles if workflow.acting(r, state))
        rows.append(_row(role, workflow.segment(role, state)))
        state = workflow.act(role, state, answer(role, state)).state
    return state, rows


def test_parse_action_takes_the_last_allowed_line():
    text = "I think.\nsearch: founder of X\nthen\nOpen:  d12 \nanswer: nope"
    assert parse_action(text, ("search", "open")) == ("open", "d12")
    assert parse_action(text, ("answer",)) == ("answer", "nope")
    assert parse_action("search:\nresult:   ", ("search", "result")) is None
    assert parse_action("call founder of X", ("call",)) is None


def test_oracle_episode_solves_with_one_call_per_hop_and_full_rewards():
    workflow = _deep()
    task = workflow.env.task("eval", 3)
    state, rows = _play(workflow, workflow.initial_state(task), workflow.demonstration)
    assert state.done and state.success and state.env.answer == task.answer
    assert [c.subtask for c in state.calls] == [h.subtask for h in task.hops]
    assert [c.result for c in state.calls] == [h.answer for h in task.hops]
    assert all(c.expert == 1.0 and c.format_ok for c in state.calls)
    assert [r.role for r in rows] == ["main", "sub", "sub", "sub", "main", "sub", "sub", "sub", "main"]
    assert [r.segment for r in rows if r.role == "sub"] == [0, 0, 0, 1, 1, 1]
    workflow.settle(state, rows)
    assert all(r.reward == pytest.approx(1.0) for r in rows)  # 0.1 + 0.9 and 0.1 + 0.4 + 0.5
    assert all(r.success for r in rows)


def test_sub_sees_its_task_and_tool_observations_main_sees_findings():
    workflow = _deep()
    task = workflow.env.task("train", 0)
    state = workflow.initial_state(task)
    assert workflow.acting("main", state) and not workflow.acting("sub", state)
    state = workflow.act("main", state, f"call: {task.hops[0].subtask}").state
    assert workflow.acting("sub", state) and not workflow.acting("main", state)
    state = workflow.act("sub", state, f"search: {task.hops[0].subtask}").state
    prompt = workflow.prompt("sub", state)
    assert f"Task: {task.hops[0].subtask}" in prompt and "=> [d" in prompt
    assert "result: <text>" in prompt and "answer:" not in prompt  # the sub-agent's own tools, no answer
    state = workflow.act("sub", state, "result: somebody").state
    assert "Findings:\n" + f"{task.hops[0].subtask} -> somebody" in workflow.prompt("main", state)
    assert state.calls[0].expert == 0.0 and workflow.segment("sub", state) == 1


def test_rewards_for_wrong_answers_format_failures_and_unjudged_subtasks():
    workflow = _deep()
    task = workflow.env.task("train", 1)
    script = iter(["call: founder of Nobody Known", "result: x",  # unjudgeable sub-task: expert follows main
                   f"call: {task.hops[0].subtask}", "no action at all",  # sub format failure
                   "answer: wrong"])
    state, rows = _play(workflow, workflow.initial_state(task), lambda role, st: next(script))
    assert state.done and not state.success
    workflow.settle(state, rows)
    main = [r.reward for r in rows if r.role == "main"]
    sub = {r.segment: r.reward for r in rows if r.role == "sub"}
    assert main == [pytest.approx(0.1)] * 3  # valid format, wrong answer
    assert sub[0] == pytest.approx(0.1)  # format only: main wrong, expert unjudged → follows main (0)
    assert sub[1] == 0.0  # invalid format
    assert rows[1].info["expert_judged"] == 0.0 and "expert" not in rows[1].info


def test_main_format_failure_ends_the_episode_with_zero_reward():
    workflow = _deep()
    state, rows = _play(workflow, workflow.initial_state(workflow.env.task("train", 2)), lambda r, s: "hmm")
    assert state.done and len(rows) == 1
    workflow.settle(state, rows)
    assert rows[0].reward == 0.0 and rows[0].info["format"] == 0.0


def test_budgets_sub_turns_and_max_calls():
    workflow = _deep(sub_turns=2, max_calls=1)
    task = workflow.env.task("train", 3)
    state = workflow.act("main", workflow.initial_state(task), "call: a of b").state
    state = workflow.act("sub", state, "search: a").state
    out = workflow.act("sub", state, "search: b")  # the second action was the last one the call had
    assert out.state.active is None and out.state.calls[0].format_ok is False
    out = workflow.act("main", out.state, "call: c of d")  # one call allowed
    assert out.state.done and not out.format_ok and not out.state.main_ok


def test_unexpected_roles_are_rejected():
    with pytest.raises(ConfigError, match="two roles"):
        _deep(roles=["main"])


def test_solo_oracle_uses_every_tool_and_scores_like_the_main_agent():
    workflow = _solo()
    task = workflow.env.task("eval", 5)
    state, rows = _play(workflow, workflow.initial_state(task), workflow.demonstration)
    assert state.success and len(rows) == 2 * len(task.hops) + 1
    workflow.settle(state, rows)
    assert all(r.reward == pytest.approx(1.0) for r in rows)
    assert "=> [d" in workflow.prompt("agent", replace(state, done=False))
    assert "answer: <text>" in workflow.prompt("agent", replace(state, done=False))


def test_engine_batches_main_and_sub_of_different_episodes_per_policy():
    """Episodes desynchronise (a sub-agent that searches twice); each turn still makes ≤ one call per policy."""
    workflow = _deep()
    states: dict[str, tuple[str, object]] = {}
    prompt = workflow.prompt

    def remember(role, state):
        text = prompt(role, state)
        states[text] = (role, state)
        return text

    workflow.prompt = remember

    def answer(policy, text, rng):
        role, state = states[text]
        if role == "sub" and not state.active.steps and rng.random() < 0.4:
            return "search: something else"  # one action more than the oracle's three
        if role == "sub" and state.active.steps and state.active.steps[0][0] == "search: something else":
            state = replace(state, active=replace(state.active, steps=state.active.steps[1:]))
        return workflow.demonstration(role, state)

    tasks = [workflow.env.task("train", i) for i in range(4)]
    policies = {"main": SimpleNamespace(name="main"), "sub": SimpleNamespace(name="sub")}
    gen = ScriptedGenerator(answer, seed=1)
    result = Rollout(workflow, policies, {"main": "main", "sub": "sub"}, gen, Sampling(1.0)).play(tasks, 3)
    assert all(ep.success for ep in result.episodes)
    assert max(result.calls_per_turn) == 2 and 2 in result.calls_per_turn  # main and sub acted in one turn
    assert all(s.reward == pytest.approx(1.0) for s in result.samples)
    rows, stats = mgrpo_advantages(result.samples, 2, ["sub"], rng=random.Random(0))
    assert stats["sub/d_mean"] == 2 and stats["sub/duplicated"] == 0 and stats["sub/aligned"] == 4 * 3 * 2
    assert all(s.advantage == 0.0 for s in rows)  # every rollout solved: no signal


def test_rescore_recomputes_settled_rewards_with_other_coefficients():
    workflow = _deep()
    task = workflow.env.task("eval", 4)
    state, rows = _play(workflow, workflow.initial_state(task), workflow.demonstration)
    workflow.settle(state, rows)
    other = _deep(sub_expert=0.0, sub_main_correct=0.0, main_correct=0.5)
    other.rescore(rows)
    assert {r.role: r.reward for r in rows} == {"main": pytest.approx(0.6), "sub": pytest.approx(0.1)}
