"""The tool → plan workflow: the tool's code is simulated on a copy, the plan moves the real state."""

import pytest
from omegaconf import OmegaConf

from marl_cli.config.schema import PlanPathConfig, SandboxConfig, WorkflowConfig
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.sandbox import Sandbox
from marl_cli.workflows.base import extract_code
from marl_cli.workflows.tool_plan import ToolPlanWorkflow
from tests.envs.test_plan_path import GRID


@pytest.fixture(scope="module")
def workflow():
    env = PlanPathEnv(PlanPathConfig(shaping=False, stop_at_goal=False, actions_per_episode=2),
                      sandbox=Sandbox(SandboxConfig(timeout_s=2, cpu_seconds=1)))
    cfg = OmegaConf.structured(WorkflowConfig(name="tool_plan", roles=["tool", "plan"], max_turns=2,
                                              prompts={"tool": "{observation} code {marker}",
                                                       "plan": "{observation} tool said: {tool} {marker}"}))
    return ToolPlanWorkflow(cfg, env)


def test_extract_code_prefers_fences_then_the_marker():
    assert extract_code("x\n```python\nprint(1)\n```\n#### print(2)", "####") == "print(1)"
    assert extract_code("think #### print('R')", "####") == "print('R')"
    assert extract_code("no code here", "####") is None
    assert extract_code(" print(3) ", "") == "print(3)" and extract_code("  ", "") is None  # empty marker: all of it


def test_tool_is_scored_on_a_copy_and_its_output_reaches_the_plan_prompt(workflow):
    state = workflow.initial_state(GRID)
    good, bad, crash, empty = workflow.act_many("tool", [
        (state, "#### print('D D R R')"), (state, "#### print('U')"), (state, "#### 1/0"), (state, "nothing")])
    assert good.state.env == state.env  # the real environment did not move
    assert good.solved and not good.success and good.format_ok
    assert good.local == pytest.approx(4 * -0.01 + 1.5) and good.team == 1.0
    assert good.reward == pytest.approx(good.local + good.team)
    assert not bad.solved and bad.team == 0.0 and bad.local == pytest.approx(-0.1)  # invalid move; not last action
    assert not crash.format_ok and crash.info["code_error"] == 1.0 and crash.local == -2.0
    assert not empty.format_ok and empty.state.notes["tool"] == "no code"
    assert "tool said: D D R R" in workflow.prompt("plan", good.state)


def test_plan_moves_the_real_environment(workflow):
    state = workflow.initial_state(GRID)
    first = workflow.act("plan", state, "#### D")
    assert first.state.env.pos == (1, 0) and not first.done
    last = workflow.act("plan", first.state, "#### U")
    assert last.done and not last.success  # out of actions: a timeout, not a success
    win = workflow.act("plan", state, "#### D D R R")
    assert win.done and win.success and win.solved


def test_demonstrations_solve_the_task_through_the_workflow(workflow):
    state = workflow.initial_state(GRID)
    tool = workflow.act("tool", state, workflow.demonstration("tool", state))
    assert tool.solved
    plan = workflow.act("plan", tool.state, workflow.demonstration("plan", tool.state))
    assert plan.success


def test_an_empty_answer_marker_makes_the_whole_reply_the_answer(workflow):
    whole = type(workflow)(OmegaConf.merge(workflow.cfg, {"answer_marker": ""}), workflow.env)
    assert whole.parse("  R D \n") == "R D" and whole.parse(" ") is None
    assert whole.format_answer("R D") == "R D" and workflow.format_answer("R D") == "#### R D"
