from dataclasses import replace

import pytest
from hydra import compose, initialize_config_dir

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import MathConfig, PlanPathConfig, SandboxConfig, WorkflowConfig
from marl_cli.envs.math_data import MathTask
from marl_cli.envs.math_problems import MathEnv
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.plugins import register_configs
from marl_cli.rollout.generation import Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.workflows import build_workflow
from marl_cli.workflows.single_agent import SingleAgentWorkflow
from marl_cli.workflows.tool_reason import ToolReasonWorkflow, printed_answer

TASK = MathTask("What is 5 + 7?", "12")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=2, cpu_seconds=1))


def workflow_cfg(**kw) -> WorkflowConfig:
    return WorkflowConfig(**{"name": "tool_reason", "roles": ["tool", "reasoner"], "max_turns": 3, **kw})


@pytest.fixture(scope="module")
def wf(sandbox):
    return ToolReasonWorkflow(workflow_cfg(), MathEnv(MathConfig(actions_per_episode=3), 0, sandbox))


def tool(wf, text, state=None):
    return wf.act("tool", state or wf.initial_state(TASK), text)


def code(body: str) -> str:
    return f"Let me compute.\n```python\n{body}\n```"


# --- the tool agent --------------------------------------------------------------------------------


def test_tool_printing_the_right_answer(wf):
    start = wf.initial_state(TASK)
    out = tool(wf, code("print(5 + 7)"), start)
    assert out.local == 1.0 and out.team == 1.0 and out.reward == 2.0 and out.format_ok
    assert out.state.notes["tool"] == "12"
    assert out.state.env == start.env and not out.done  # only the reasoner acts on the real environment
    assert out.info["code_error"] == 0.0 and out.info["correct"] == 1.0


def test_tool_answer_is_the_last_printed_line(wf):
    out = tool(wf, "#### x = 5\nprint('thinking...')\nprint(x + 7)\nprint()")
    assert out.local == 1.0 and out.state.notes["tool"] == "12"
    assert tool(wf, code("print('0.5')"), wf.initial_state(MathTask("half?", "\\frac{1}{2}"))).local == 1.0
    assert printed_answer("a\n\\boxed{3}\n\n") == "3" and printed_answer("") is None


def test_tool_printing_a_wrong_answer(wf):
    out = tool(wf, code("print(5 + 8)"))
    assert out.local == 0.0 and out.team == 0.0 and out.reward == 0.0 and out.format_ok
    assert out.state.notes["tool"] == "13"


def test_crashing_code_is_a_format_failure(wf):
    out = tool(wf, code("raise ValueError('no')"))
    assert out.local == -1.0 and out.team == 0.0 and out.reward == -1.0 and not out.format_ok
    assert out.state.notes["tool"] == "error"
    assert out.info["code_error"] == 1.0 and out.info["timed_out"] == 0.0


def test_code_that_never_finishes_times_out(wf):
    out = tool(wf, code("import time\nwhile True:\n    time.sleep(0.1)"))
    assert out.local == -1.0 and not out.format_ok and out.state.notes["tool"] == "error"
    assert out.info["timed_out"] == 1.0
    spin = tool(wf, code("while True:\n    pass"))  # CPU limit or wall clock, whichever comes first
    assert spin.local == -1.0 and spin.info["code_error"] == 1.0


def test_missing_code_or_no_output_is_a_format_failure(wf):
    for text in ["I think it is 12.", code("x = 12"), code("print('???')")]:
        out = tool(wf, text)
        assert out.local == -1.0 and not out.format_ok and out.state.notes["tool"] == "error", text
    assert tool(wf, "no code").info["no_code"] == 1.0


def test_tool_jobs_run_together_in_order(wf):
    start = wf.initial_state(TASK)
    texts = [code("print(12)"), "no code", code("print(11)"), code("1/0"), code("print(24 // 2)")]
    outs = wf.act_many("tool", [(start, t) for t in texts])
    assert [o.local for o in outs] == [1.0, -1.0, 0.0, -1.0, 1.0]


# --- the reasoner ----------------------------------------------------------------------------------


def test_reasoner_correct_boxed_answer_succeeds(wf):
    after_tool = tool(wf, code("print(13)")).state
    out = wf.act("reasoner", after_tool, "5 + 7 = 12, so \\boxed{12}.")
    assert out.success and out.done and out.format_ok
    assert out.local == 1.0 and out.team == 1.0 and out.reward == 2.0  # the paper's 2·1[correct]
    assert out.state.env.answer == "12" and out.state.env.actions == 1
    assert out.state.notes["reasoner"] == "12" and out.info["agreed"] == 0.0


def test_reasoner_agreeing_with_the_tool_ends_the_episode_even_if_wrong(wf):
    after_tool = tool(wf, code("print(26 / 2)")).state  # prints 13.0
    out = wf.act("reasoner", after_tool, "\\boxed{13}")
    assert out.done and not out.success and out.format_ok
    assert out.reward == 0.0 and out.info["agreed"] == 1.0


def test_reasoner_disagreeing_and_wrong_continues(wf):
    after_tool = tool(wf, code("print(11)")).state
    out = wf.act("reasoner", after_tool, "\\boxed{13}")
    assert not out.done and not out.success and out.reward == 0.0 and out.info["agreed"] == 0.0
    assert out.state.env.actions == 1 and out.state.notes["reasoner"] == "13"


def test_reasoner_falls_back_to_the_answer_marker(wf):
    out = wf.act("reasoner", wf.initial_state(TASK), "It is twelve.\n#### 12")
    assert out.success and out.done


@pytest.mark.parametrize("text", ["I am not sure.", "\\boxed{}", "\\boxed{12", "#### ???"])
def test_unreadable_reasoner_answer_is_a_format_failure(wf, text):
    after_tool = tool(wf, code("print(12)")).state
    out = wf.act("reasoner", after_tool, text)
    assert not out.format_ok and not out.success and not out.done
    assert out.local == -1.0 and out.reward == -1.0 and out.state.notes["reasoner"] == "none"


def test_last_reasoner_action_ends_the_episode(wf):
    state = wf.initial_state(TASK)
    for turn in range(3):
        state = tool(wf, code("print(1)"), state).state
        out = wf.act("reasoner", state, "\\boxed{2}")
        state = out.state
        assert out.done == (turn == 2)
    assert not state.success


# --- demonstrations, prompts, config ---------------------------------------------------------------


def test_demonstrations_played_through_the_workflow_solve_the_task(wf):
    env = wf.env
    for i in range(12):
        state = wf.initial_state(env.task("warmstart", i))
        demo = wf.demonstration("tool", state)
        assert demo.startswith("#### print(")
        tool_out = wf.act("tool", state, demo)
        assert tool_out.local == 1.0 and tool_out.team == 1.0, (env.task("warmstart", i), demo)
        reason = wf.demonstration("reasoner", tool_out.state)
        assert reason == f"\\boxed{{{env.task('warmstart', i).answer}}}"
        out = wf.act("reasoner", tool_out.state, reason)
        assert out.success and out.done and out.reward == 2.0


def test_yaml_prompts_render(sandbox):
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["env=math", "workflow=tool_reason"])
    assert cfg.env.actions_per_episode == cfg.workflow.max_turns and cfg.env.eval_size == 100
    wf = build_workflow(cfg.workflow, MathEnv(cfg.env, 0, sandbox))
    state = wf.act("tool", wf.initial_state(TASK), wf.demonstration("tool", wf.initial_state(TASK))).state
    prompt = wf.prompt("reasoner", state)
    assert "What is 5 + 7?" in prompt and "Code output: 12" in prompt and "\\boxed{...}" in prompt
    assert "####" in wf.prompt("tool", state) and "Your last answer: none" in wf.prompt("tool", state)
    state = wf.act("reasoner", state, "\\boxed{13}").state  # wrong, but the tool said 12: the episode goes on
    assert not state.done and "Your last answer: 13" in wf.prompt("tool", state)


def test_config_errors(sandbox):
    env = MathEnv(MathConfig(), 0, sandbox)
    with pytest.raises(ConfigError, match=r"roles \[tool, reasoner\]"):
        ToolReasonWorkflow(workflow_cfg(roles=["reasoner", "tool"]), env)
    with pytest.raises(ConfigError, match="needs a sandbox"):
        ToolReasonWorkflow(workflow_cfg(), MathEnv(MathConfig()))
    with pytest.raises(ConfigError, match="env=math"):
        ToolReasonWorkflow(workflow_cfg(), PlanPathEnv(PlanPathConfig(), 0, sandbox))


def test_single_agent_works_with_math():
    env = MathEnv(MathConfig(actions_per_episode=1))
    wf = SingleAgentWorkflow(WorkflowConfig(name="single_agent", roles=["agent"]), env)
    state = wf.initial_state(TASK)
    assert wf.demonstration("agent", state) == "#### 12"
    right = wf.act("agent", state, "5 plus 7 #### 12")
    assert right.success and right.done and right.reward == 2.0
    wrong = wf.act("agent", state, "#### \\boxed{13}")
    assert not wrong.success and wrong.done and wrong.reward == 0.0
    missing = wf.act("agent", state, "12")
    assert not missing.format_ok and missing.reward == -1.0
    assert "What is 5 + 7?" in wf.prompt("agent", replace(state))


def test_warm_start_demonstrations_cover_both_roles(wf):
    from types import SimpleNamespace

    from marl_cli.training.warmstart import demonstrations

    sampling = Sampling(0.0, use_chat_template=False)
    data = demonstrations(wf, ["tool", "reasoner"], 10, sampling, SimpleNamespace(tokenizer=None), chunk=10)
    assert len(data) == 20
    tools = [c for c in data["completion"] if c.startswith("#### print(")]
    boxed = [c for c in data["completion"] if c.startswith("\\boxed{")]
    assert len(tools) == len(boxed) == 10  # the same number of demonstrations for every role
    assert all(p.startswith(wf.env.rules()) for p in data["prompt"])
