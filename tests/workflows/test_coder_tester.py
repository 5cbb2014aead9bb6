import random

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import CodeConfig, CodeTestConfig, SandboxConfig, WorkflowConfig
from marl_cli.envs import build_env
from marl_cli.envs.code import CodeEnv
from marl_cli.envs.code_data import Problem
from marl_cli.plugins import register_configs
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Generation, Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.workflows import build_workflow
from marl_cli.workflows.coder_tester import CodeTestWorkflow, format_tests, parse_tests
from marl_cli.workflows.single_agent import SingleAgentWorkflow

register_configs()

SUM = Problem("sum", "Read a and b. Print a + b.", (("1 2\n", "3\n"), ("0 0\n", "0\n"), ("2 5\n", "7\n")),
              "a, b = map(int, input().split())\nprint(a + b)")
RIGHT = "#### a, b = map(int, input().split())\nprint(a + b)"
MINUS = "#### a, b = map(int, input().split())\nprint(a - b)"  # passes only 0 0 → 0: p_gt = 1/3


class CountingSandbox:
    """A real sandbox that counts its batches."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def run_many(self, jobs):
        self.batches.append(len(jobs))
        return self.inner.run_many(jobs)


@pytest.fixture(scope="module")
def sandbox():
    return CountingSandbox(Sandbox(SandboxConfig(timeout_s=2, cpu_seconds=1)))


PROMPTS = dict(OmegaConf.load(config_dir() / "workflow" / "code_test.yaml").prompts)


def make(sandbox, weight=1.0, turns=3):
    env = CodeEnv(CodeConfig(actions_per_episode=turns), sandbox=sandbox)
    cfg = OmegaConf.structured(CodeTestConfig(name="code_test", roles=["coder", "tester"], max_turns=turns,
                                              tester_agreement_weight=weight, prompts=PROMPTS))
    return CodeTestWorkflow(cfg, env)


@pytest.fixture(scope="module")
def wf(sandbox):
    return make(sandbox)


def coded(wf, text, problem=SUM):
    return wf.act("coder", wf.initial_state(problem), text)


# -- coder ----------------------------------------------------------------------------------------


def test_coder_rewards(wf):
    right = coded(wf, RIGHT)
    assert (right.reward, right.local, right.team) == (2.0, 1.0, 1.0) and right.success and right.format_ok
    assert not right.done  # the tester still acts in this stage
    partial = coded(wf, MINUS)
    assert partial.local == pytest.approx(1 / 3) and partial.reward == pytest.approx(2 / 3) and not partial.success
    syntax = coded(wf, "#### print(")
    assert syntax.reward == 0.0 and syntax.format_ok
    fenced = coded(wf, "Sure.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```")
    assert fenced.success
    missing = coded(wf, "I would add the numbers.")
    assert not missing.format_ok and missing.reward == -1.0 and missing.state.env.code is None


def test_coder_infinite_loop(sandbox):
    wf = make(sandbox)
    loop = wf.act("coder", wf.initial_state(Problem("p", "s", (("1\n", "1\n"),), "print(1)")),
                  "#### while True:\n    pass")
    assert loop.reward == 0.0 and loop.format_ok and loop.state.env.p_gt == 0.0


def test_coder_note_is_its_program(wf):
    out = coded(wf, MINUS)
    assert out.state.notes["coder"] == MINUS.removeprefix("#### ")
    assert "print(a - b)" in wf.prompt("tester", out.state)


# -- tester ---------------------------------------------------------------------------------------


def test_tester_p_golden_and_format(wf):
    state = coded(wf, RIGHT).state
    good = wf.act("tester", state, "#### 1 2 => 3\n4 4 => 8")
    assert good.info["p_golden"] == 1.0 and good.format_ok
    half = wf.act("tester", state, "#### 1 2 => 3\n4 4 => 9")
    assert half.info["p_golden"] == 0.5
    for bad in ("no marker 1 2 => 3", "#### 1 2 3", "####"):
        out = wf.act("tester", state, bad)
        assert not out.format_ok and out.local == -1.0 and out.team == 1.0 and out.state.env.tests == ()
        assert "tester" not in out.state.notes


def test_tester_agreement(sandbox):
    wf, paper = make(sandbox, weight=1.0), make(sandbox, weight=0.0)
    text = "#### 1 2 => 3\n0 0 => 0\n1 1 => 5"  # valid (catches a - b), valid (a - b passes it), invalid
    wrong = coded(wf, MINUS).state
    out = wf.act("tester", wrong, text)
    assert out.info["p_golden"] == pytest.approx(2 / 3)
    assert out.info["agreement"] == 0.5  # of the two valid tests only "1 2 => 3" rejects the wrong program
    assert out.local == pytest.approx(2 / 3 + 0.5) and out.team == pytest.approx(1 / 3)
    assert out.reward == pytest.approx(1 / 3 + 2 / 3 + 0.5)
    assert paper.act("tester", wrong, text).reward == pytest.approx(1 / 3 + 2 / 3)  # w = 0: p_gt + p_golden
    right = wf.act("tester", coded(wf, RIGHT).state, text)
    assert right.info["agreement"] == 1.0  # both valid tests accept the correct program
    nothing = wf.act("tester", wf.initial_state(SUM), text)
    assert nothing.info["agreement"] == 0.0 and nothing.info["p_golden"] == pytest.approx(2 / 3)


def test_no_golden_gives_no_tester_credit(wf):
    problem = Problem("lcb", "Read a and b. Print a + b.", SUM.tests, None)
    out = wf.act("tester", coded(wf, RIGHT, problem).state, "#### 1 2 => 3")
    assert out.info["p_golden"] == 0.0 and out.info["agreement"] == 0.0 and out.local == 0.0
    assert wf.demonstration("coder", wf.initial_state(problem)) is None


def test_early_stop_when_the_program_passes_the_generated_tests(wf):
    wrong = coded(wf, MINUS).state
    stop = wf.act("tester", wrong, "#### 0 0 => 0\n5 5 => 0")  # a - b passes both (invalid) tests
    assert stop.done and not stop.success and stop.info["early_stop"] == 1.0
    go_on = wf.act("tester", wrong, "#### 0 0 => 0\n1 2 => 3")
    assert not go_on.done and go_on.info["early_stop"] == 0.0
    solved = wf.act("tester", coded(wf, RIGHT).state, "#### 1 2 => 3")
    assert solved.done and solved.success


def test_last_turn_ends_the_episode(wf):
    state = wf.initial_state(SUM)
    for _turn in range(3):
        state = wf.act("coder", state, MINUS).state
        assert not state.done
        state = wf.act("tester", state, "#### 1 2 => 3").state
    assert state.done and not state.success and state.env.actions == 3


# -- the parallel stage through the real engine ---------------------------------------------------


class ScriptedGenerator:
    """Answers every prompt with the script of the role it recognises; records the prompts."""

    def __init__(self, scripts):
        self.scripts, self.calls, self.prompts = scripts, 0, []

    def generate(self, policy, prompts, sampling):
        self.calls += 1
        self.prompts.append(prompts)
        out = []
        for p in prompts:
            script = self.scripts["tester" if "Program:" in p else "coder"]
            out.append(Generation([1], [2], script.pop(0)))
        return out


def test_parallel_stage_prompts_from_the_start_and_scores_the_tester_on_the_new_program(wf):
    assert wf.stages(0) == [["coder", "tester"]]
    gen = ScriptedGenerator({"coder": [MINUS, RIGHT], "tester": ["#### 1 2 => 3\n0 0 => 0", "#### 2 5 => 7"]})
    result = Rollout(wf, {"shared": None}, {"coder": "shared", "tester": "shared"}, gen, Sampling(1.0)).play(
        [SUM], 1, random.Random(0))
    assert gen.calls == 2  # one call per turn: both roles of the stage in one batch
    first = gen.prompts[0]
    assert any("Program: none" in p for p in first) and any("Tests: none" in p for p in first)
    second = gen.prompts[1]
    assert any("Program: a, b = map(int, input().split())\nprint(a - b)" in p for p in second)
    assert any("Tests: 1 2 => 3\n0 0 => 0" in p for p in second)
    rows = {(s.turn, s.role): s for s in result.samples}
    # Turn 0: the tester was prompted before the coder's program existed, but is scored against it.
    assert rows[0, "tester"].info["agreement"] == 0.5 and rows[0, "tester"].info["team"] == pytest.approx(1 / 3)
    assert rows[1, "coder"].reward == 2.0 and rows[1, "tester"].info["early_stop"] == 1.0
    ep = result.episodes[0]
    assert ep.success and ep.done and ep.turns == 2


def test_act_many_batches_every_candidate_in_one_sandbox_call(wf, sandbox):
    start = wf.initial_state(SUM)
    before = len(sandbox.batches)
    outs = wf.act_many("coder", [(start, RIGHT), (start, MINUS), (start, "nothing"), (start, "#### print(3)")])
    assert len(sandbox.batches) == before + 1
    assert [o.format_ok for o in outs] == [True, True, False, True]
    state = outs[1].state
    tests = ["#### 4 4 => 8", "#### 9 9 => 18\n1 1 => 2", "#### x"]
    wf.act_many("tester", [(state, t) for t in tests])
    assert len(sandbox.batches) == before + 2


# -- test format, demonstrations, config ----------------------------------------------------------


def test_test_format_round_trip():
    tests = (("2\n3\n4\n", "7\n"), ("\n", "0\n"), ("5\n", "*\n**\n"))
    text = format_tests(tests)
    assert text == "2\\n3\\n4 => 7\n => 0\n5 => *\\n**"
    assert parse_tests(text, 10) == (("2\n3\n4\n", "7\n"), ("", "0\n"), ("5\n", "*\n**\n"))
    assert parse_tests("1 => 1\n1 => 1\nnoise\n2 => 2", 10) == (("1\n", "1\n"), ("2\n", "2\n"))
    assert len(parse_tests("\n".join(f"{i} => {i}" for i in range(20)), 5)) == 5


def test_demonstrations_solve_every_eval_problem_through_the_workflow(wf):
    problems = wf.env.eval_problems[:5]
    starts = [wf.initial_state(p) for p in problems]
    coders = wf.act_many("coder", [(s, wf.demonstration("coder", s)) for s in starts])
    testers = wf.act_many("tester", [(c.state, wf.demonstration("tester", s))
                                     for c, s in zip(coders, starts, strict=True)])
    for c, t in zip(coders, testers, strict=True):
        assert c.reward == 2.0
        assert t.done and t.success and t.info["p_golden"] == 1.0 and t.info["agreement"] == 1.0
        assert t.reward == 1.0 + 1.0 + 1.0
        assert 2 <= t.info["tests"] <= 3


def test_single_agent_on_code(sandbox):
    env = CodeEnv(CodeConfig(actions_per_episode=1), sandbox=sandbox)
    wf = SingleAgentWorkflow(OmegaConf.structured(WorkflowConfig(name="single_agent")), env)
    state = wf.initial_state(env.task("eval", 0))
    demo = wf.demonstration("agent", state)
    assert demo.startswith("#### ")
    out = wf.act("agent", state, demo)
    assert out.success and out.done and out.reward == 2.0
    bad = wf.act("agent", state, "no answer")
    assert not bad.format_ok and bad.done and bad.reward == -1.0


def _compose(overrides):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_configs_build_the_workflow(sandbox):
    cfg = _compose(["env=code", "workflow=code_test", "workflow.tester_agreement_weight=0.25"])
    env = build_env(cfg.env, 0, sandbox)
    wf = build_workflow(cfg.workflow, env)
    assert isinstance(wf, CodeTestWorkflow) and wf.agreement_weight == 0.25
    assert env.cfg.actions_per_episode == 3 and env.cfg.eval_size == len(env.eval_problems) == 10
    assert "{tester}" in cfg.workflow.prompts.coder and "{coder}" in cfg.workflow.prompts.tester
    with pytest.raises(ConfigError, match="roles"):
        build_workflow(_compose(["env=code", "workflow=code_test", "workflow.roles=[tester,coder]"]).workflow, env)
    with pytest.raises(ConfigError, match="env=code"):
        plan = _compose(["workflow=code_test"])
        build_workflow(plan.workflow, build_env(plan.env, 0, sandbox))
    with pytest.raises(ConfigError, match="sandbox"):
        build_workflow(cfg.workflow, build_env(cfg.env, 0, None))
    single = _compose(["env=code", "workflow=single_agent", "env.eval.source=embedded"])
    assert isinstance(build_workflow(single.workflow, build_env(single.env, 0, sandbox)), SingleAgentWorkflow)
