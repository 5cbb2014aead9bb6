"""Function-completion problems (HumanEval, MBPP formats): loaded from local files, golden programs checked
at load, answers scored by the problems' own checks in the sandbox."""

import json

import pytest

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import CodeConfig, CodeSourceConfig, SandboxConfig, WorkflowConfig
from marl_cli.envs import code_data
from marl_cli.envs.code import CodeEnv
from marl_cli.sandbox import Sandbox
from marl_cli.workflows.coder_tester import CodeTestWorkflow

HUMANEVAL = [
    {"task_id": "HumanEval/0", "entry_point": "add", "prompt": 'def add(a, b):\n    """Return a + b."""\n',
     "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"},
    {"task_id": "HumanEval/1", "entry_point": "double", "prompt": 'def double(x):\n    """Return 2x."""\n',
     "canonical_solution": "    return x + x\n", "test": "def check(candidate):\n    assert candidate(4) == 8\n"},
    {"task_id": "HumanEval/2", "entry_point": "broken", "prompt": "def broken(x):\n",  # its golden fails
     "canonical_solution": "    return x\n", "test": "def check(candidate):\n    assert candidate(1) == 2\n"},
]
MBPP = [
    {"task_id": 1, "text": "Write a function to square a number.", "code": "def square(x):\n    return x * x",
     "test_list": ["assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 0"],
     "test_setup_code": ""},
    {"task_id": 2, "text": "Write a function to negate a number.", "code": "def neg(x):\n    return -x",
     "test_list": ["assert neg(3) == -3", "assert neg(0) == 0"], "test_setup_code": ""},
]


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=5, cpu_seconds=2))


def _file(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _env(tmp_path, sandbox, source, rows):
    path = _file(tmp_path, f"{source}.jsonl", rows)
    split = CodeSourceConfig(source=source, path=path)
    return CodeEnv(CodeConfig(train=split, eval=split, actions_per_episode=1), seed=0, sandbox=sandbox)


def test_humaneval_rows_load_and_a_golden_that_fails_its_checks_is_skipped(tmp_path, sandbox, caplog):
    env = _env(tmp_path, sandbox, "humaneval", HUMANEVAL)
    assert [p.id for p in env.eval_problems] == ["humaneval:0", "humaneval:1"]
    assert "golden program fails its own tests" in caplog.text
    problem = env.eval_problems[0]
    assert problem.function and "def add(a, b):" in problem.statement
    assert env.rules().startswith("Write the Python 3 function")
    assert env.step(env.initial_state(problem), problem.solution).success
    right = env.step(env.initial_state(problem), "```python\ndef add(a, b):\n    print('hi')\n    return b + a\n```")
    assert right.success and right.reward == 1.0  # its own prints do not hide the pass marker
    wrong = env.step(env.initial_state(problem), "def add(a, b):\n    return a - b")
    assert not wrong.success and wrong.reward == 0.0
    missing = env.step(env.initial_state(problem), "def plus(a, b):\n    return a + b")  # NameError in check
    assert not missing.success


def test_mbpp_scores_the_share_of_asserts_passed(tmp_path, sandbox):
    env = _env(tmp_path, sandbox, "mbpp", MBPP)
    problem = env.eval_problems[0]
    assert len(problem.tests) == 3 and "assert square(3) == 9" in problem.statement
    partial = env.step(env.initial_state(problem), "def square(x):\n    return x + 1")
    assert partial.reward == pytest.approx(0.0)
    half = env.step(env.initial_state(problem), "def square(x):\n    return 9 if x == 3 else 4")
    assert half.reward == pytest.approx(2 / 3) and not half.success
    assert env.step(env.initial_state(problem), problem.solution).success


def test_a_check_that_cannot_be_cheated_by_printing_the_marker(tmp_path, sandbox):
    env = _env(tmp_path, sandbox, "mbpp", MBPP)
    problem = env.eval_problems[0]
    cheat = f"print({code_data.PASSED!r})\nimport sys\nsys.exit(0)"
    assert not env.step(env.initial_state(problem), cheat).success  # exits before the checks: no final marker


def test_function_and_stdio_sources_do_not_mix_and_code_test_refuses_functions(tmp_path, sandbox):
    functions = CodeSourceConfig(source="mbpp", path=_file(tmp_path, "m.jsonl", MBPP))
    with pytest.raises(ConfigError, match="mix function problems"):
        CodeEnv(CodeConfig(train=functions, eval=CodeSourceConfig()), seed=0, sandbox=sandbox)
    env = CodeEnv(CodeConfig(train=functions, eval=functions), seed=0, sandbox=sandbox)
    with pytest.raises(ConfigError, match="function problems .* train with workflow=single_agent"):
        CodeTestWorkflow(WorkflowConfig(name="code_test", roles=["coder", "tester"]), env)
