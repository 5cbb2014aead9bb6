"""The CORY workflow: the pioneer is scored on a copy, the observer sees its answer and moves the real env, and
every row of a turn gets the collective reward (both agents' rewards of that turn, computed here by hand)."""

import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import CodeConfig, MathConfig, PlanPathConfig, SandboxConfig
from marl_cli.config.validate import check_config
from marl_cli.envs.code import CodeEnv
from marl_cli.envs.math_data import MathTask
from marl_cli.envs.math_problems import MathEnv
from marl_cli.envs.plan_path import PlanPathEnv
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.training.loop import train
from marl_cli.workflows.cory import CoryConfig, CoryWorkflow
from tests.envs.test_plan_path import GRID
from tests.helpers import FAST, SMALL, ScriptedGenerator, train_config
from tests.workflows.test_coder_tester import MINUS, RIGHT, SUM

PROMPTS = dict(OmegaConf.load(config_dir() / "workflow" / "cory.yaml").prompts)
QUESTION = MathTask("What is 2 + 3?", "5")


def make(env, turns=1, alpha=1.0, collective=True, roles=("pioneer", "observer")) -> CoryWorkflow:
    cfg = OmegaConf.structured(CoryConfig(name="cory", roles=list(roles), max_turns=turns, alpha=alpha,
                                          collective=collective, prompts=PROMPTS))
    return CoryWorkflow(cfg, env)


def plan_path(turns=1, **kw) -> CoryWorkflow:
    return make(PlanPathEnv(PlanPathConfig(shaping=False, stop_at_goal=False, actions_per_episode=turns)), turns, **kw)


def math(**kw) -> CoryWorkflow:
    return make(MathEnv(MathConfig(actions_per_episode=1)), **kw)


def play(workflow, task, answers):
    """One episode (K = 1) with each role answering from ``answers[role]`` in turn order; its rows by (turn, role)."""
    scripts = {role: iter(texts) for role, texts in answers.items()}
    gen = ScriptedGenerator(lambda policy, prompt, rng: next(scripts[policy]))
    policies = {role: SimpleNamespace(name=role) for role in answers}
    result = Rollout(workflow, policies, {r: r for r in answers}, gen, Sampling(1.0)).play([task], 1)
    return result.episodes[0], {(s.turn, s.role): s for s in result.samples}


def test_plan_path_rows_get_the_collective_reward():
    workflow = plan_path()
    episode, rows = play(workflow, GRID, {"pioneer": ["#### D D R R"], "observer": ["#### D D"]})
    pioneer, observer = rows[0, "pioneer"], rows[0, "observer"]
    own_pioneer = (4 * -0.01 + 1.0 + 0.5) + 1.0  # local: 4 moves, goal, shortest; team: at the goal
    own_observer = (2 * -0.01 - 1.0) + (1 - 2 / 4)  # local: 2 moves, fails on its last action; team: 2 of 4 left
    assert pioneer.info["own"] == pytest.approx(own_pioneer) and observer.info["own"] == pytest.approx(own_observer)
    assert pioneer.reward == pytest.approx(own_pioneer + own_observer)
    assert observer.reward == pytest.approx(own_pioneer + own_observer)
    assert pioneer.success and not observer.success
    assert episode.done and not episode.success  # the episode's success is the observer's
    assert episode.state.env.pos == (2, 0)  # moved by the observer's answer only
    assert "Another agent answered: D D R R" in "".join(map(chr, observer.prompt_ids))


def test_math_rows_get_the_collective_reward_and_the_ablation_their_own():
    episode, rows = play(math(), QUESTION, {"pioneer": ["#### 7"], "observer": ["#### 5"]})
    assert rows[0, "pioneer"].info["own"] == 0.0 and rows[0, "observer"].info["own"] == 2.0  # wrong: 0; right: 1 + 1
    assert rows[0, "pioneer"].reward == rows[0, "observer"].reward == 2.0
    assert episode.success and not rows[0, "pioneer"].success
    _, rows = play(math(collective=False), QUESTION, {"pioneer": ["#### 7"], "observer": ["#### 5"]})
    assert (rows[0, "pioneer"].reward, rows[0, "observer"].reward) == (0.0, 2.0)
    _, rows = play(math(), QUESTION, {"pioneer": ["#### 5"], "observer": ["no marker"]})
    assert rows[0, "pioneer"].reward == rows[0, "observer"].reward == 2.0 - 1.0  # right pioneer, unreadable observer


def test_code_programs_run_in_the_sandbox_and_pair_their_pass_rates():
    env = CodeEnv(CodeConfig(actions_per_episode=1), sandbox=Sandbox(SandboxConfig(timeout_s=2, cpu_seconds=1)))
    episode, rows = play(make(env), SUM, {"pioneer": [RIGHT], "observer": [MINUS]})
    own_pioneer, own_observer = 1.0 + 1.0, 1 / 3 + 1 / 3  # local: tests passed; team: the same share
    assert rows[0, "pioneer"].reward == rows[0, "observer"].reward == pytest.approx(own_pioneer + own_observer)
    assert rows[0, "pioneer"].success and not episode.success
    assert "print(a + b)" in "".join(map(chr, rows[0, "observer"].prompt_ids))


def test_rescore_uses_the_recorded_components_with_its_own_alpha():
    _, rows = play(math(), QUESTION, {"pioneer": ["#### 5"], "observer": ["#### 7"]})
    math(alpha=0.0).rescore(list(rows.values()))
    assert rows[0, "pioneer"].reward == rows[0, "observer"].reward == 1.0  # the task rewards alone: 1 + 0
    assert rows[0, "pioneer"].info["own"] == 1.0


def test_the_pioneer_never_changes_the_real_environment():
    workflow = plan_path(turns=2)
    state = workflow.initial_state(GRID)
    out = workflow.act("pioneer", state, "#### D D R R")
    assert out.state.env == state.env and not out.done and not out.success and out.solved
    assert out.state.notes["pioneer"] == "D D R R"
    assert workflow.act("pioneer", state, "no answer").state.notes["pioneer"] == "none"


def test_each_turn_pairs_its_own_two_answers():
    workflow = plan_path(turns=2)
    episode, rows = play(workflow, GRID, {"pioneer": ["#### U", "#### R R"], "observer": ["#### D D", "#### R R"]})
    assert episode.success and episode.turns == 2  # two observer answers: the env's two actions
    for turn in (0, 1):
        own = rows[turn, "pioneer"].info["own"] + rows[turn, "observer"].info["own"]
        assert rows[turn, "pioneer"].reward == rows[turn, "observer"].reward == pytest.approx(own)
    assert rows[1, "pioneer"].success  # R R from where the observer's D D left the team


def test_demonstrations_solve_the_task_through_the_workflow():
    workflow = plan_path()
    state = workflow.initial_state(GRID)
    pioneer = workflow.act("pioneer", state, workflow.demonstration("pioneer", state))
    observer = workflow.act("observer", pioneer.state, workflow.demonstration("observer", pioneer.state))
    assert pioneer.solved and observer.success


def test_roles_must_be_pioneer_then_observer():
    with pytest.raises(ConfigError, match=r"^workflow=cory has the roles \[pioneer, observer\] in that order, got "
                                          r"\['observer', 'pioneer'\]$"):
        plan_path(roles=("observer", "pioneer"))


def test_tree_mode_is_refused():
    cory = [*FAST, "workflow=cory", "policy=per_role", "algorithm=at_grpo"]
    check_config(train_config(*cory, "algorithm.mode=independent"))
    with pytest.raises(ConfigError, match=r"^workflow=cory needs algorithm.mode=independent: in tree mode"):
        check_config(train_config(*cory, "algorithm.mode=tree"))


def test_cory_trains_with_grpo(tmp_path):
    """Two GRPO steps after a short warm start (answers that parse, so rewards differ within groups): both policies
    take a gradient step, and every turn's two rows share one reward, so the agents' mean rewards are equal."""
    run = tmp_path / "r"
    train(train_config(*FAST, *SMALL, "workflow=cory", "algorithm=grpo", "policy=per_role", "trainer.steps=2",
                       "env.eval_size=2", "rollout.temperature=1.0", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=200", "trainer.warmstart.batch_size=16",
                       "trainer.warmstart.epochs=3", "trainer.warmstart.learning_rate=3e-3"), run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and sorted(summary["policies"]) == ["observer", "pioneer"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "train/reward" in line]
    assert len(steps) == 2
    for m in steps:
        assert m["train/pioneer/reward"] == pytest.approx(m["train/observer/reward"])
    assert all(any(m[f"train/{role}/grad_norm"] > 0 for m in steps) for role in ("pioneer", "observer"))
