"""MAPoRL's debate: the influence-aware verification reward and the incentive bonus by hand, then whole episodes."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.config.paths import config_dir
from marl_cli.config.schema import MathConfig
from marl_cli.envs.math_data import MathTask
from marl_cli.envs.math_problems import MathEnv
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.workflows.debate import DebateConfig, DebateWorkflow, incentives, verification_rewards
from tests.helpers import FAST, ScriptedGenerator, cli, step_records

PROMPT = OmegaConf.load(config_dir() / "workflow" / "debate.yaml").prompt
QUESTION = MathTask("What is 2 + 3?", "5")


def test_the_verification_reward_by_hand():
    v = [[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]  # rounds × agents
    # γ = 1: R_0a = (v_0a + 1 + 0.5) / 3; R_1a = (v_1a + 0.5) / 2; R_2a = v_2a
    assert verification_rewards(v, 1.0) == [[pytest.approx(1.5 / 3), pytest.approx(2.5 / 3)],
                                             [pytest.approx(0.75), pytest.approx(0.75)], [1.0, 0.0]]
    # γ = 0.5, round 0 of agent 0: (0 + 0.5·1 + 0.25·0.5) / (1 + 0.5 + 0.25)
    assert verification_rewards(v, 0.5)[0][0] == pytest.approx(0.625 / 1.75)


def test_revising_to_the_right_answer_is_paid_as_persuaded_or_own():
    weights = (0.3, 0.7, 0.0, 0.0)
    # agent 0 turns right after agent 1 held the right answer (persuaded); agent 1 stays right
    assert incentives([[0.0, 1.0], [1.0, 1.0]], weights) == [[0.0, 0.0], [0.3, 0.0]]
    # both wrong, then agent 0 right on its own: + w_own; agent 1 unchanged
    assert incentives([[0.0, 0.0], [1.0, 0.0]], weights) == [[0.0, 0.0], [0.7, 0.0]]
    # agent 0 right, persuaded to the wrong answer the other held: − w_persuaded
    assert incentives([[1.0, 0.0], [0.0, 0.0]], weights) == [[0.0, 0.0], [-0.3, 0.0]]
    # both right, agent 0 turns wrong on its own: − w_own
    assert incentives([[1.0, 1.0], [0.0, 1.0]], weights) == [[0.0, 0.0], [-0.7, 0.0]]


def test_leading_the_others_to_the_right_answer_is_paid_and_misleading_them_costs():
    weights = (0.0, 0.0, 0.2, 0.9)
    # agent 0 right while agent 1 is wrong; agent 1 turns right next round: agent 0 led it (+ w_lead)
    assert incentives([[1.0, 0.0], [1.0, 1.0]], weights)[0] == [0.9, 0.0]
    # agent 0 wrong, agent 1 right then wrong: agent 0 (wrong) pulled it down (− w_follow)
    assert incentives([[0.0, 1.0], [0.0, 0.0]], weights)[0] == [-0.2, 0.0]
    # three agents: the others' mean must cross both thresholds (agents 1 and 2 see a mean of ½ at round 0: none)
    assert incentives([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], weights)[0] == [0.9, 0.0, 0.0]
    assert incentives([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], weights)[0] == [0.0, 0.0, 0.0]


def make(roles=("agent_0", "agent_1"), turns=2, **weights) -> DebateWorkflow:
    cfg = OmegaConf.structured(DebateConfig(name="debate", roles=list(roles), max_turns=turns, prompt=PROMPT,
                                            **weights))
    return DebateWorkflow(cfg, MathEnv(MathConfig(actions_per_episode=1)))


def play(flow, answers):
    """One episode; each role answers from ``answers[role]`` in turn order."""
    scripts = {role: iter(texts) for role, texts in answers.items()}
    gen = ScriptedGenerator(lambda policy, prompt, rng: next(scripts[policy]))
    policies = {role: SimpleNamespace(name=role) for role in answers}
    result = Rollout(flow, policies, {r: r for r in answers}, gen, Sampling(1.0)).play([QUESTION], 1,
                                                                                         random.Random(0))
    return result.episodes[0], {(s.turn, s.role): s for s in result.samples}, gen


def test_an_episode_shows_each_agent_the_last_round_and_pays_the_formula():
    flow = make(w_persuaded=0.5)
    episode, rows, gen = play(flow, {"agent_0": ["#### 4", "#### 5"], "agent_1": ["#### 5", "#### 5"]})
    assert episode.done and episode.success and gen.batches == [("agent_0", 1), ("agent_1", 1)] * 2
    second = "".join(map(chr, rows[1, "agent_0"].prompt_ids))
    assert "Answers so far: agent_0: 4; agent_1: 5" in second
    assert "Answers so far: agent_0: none; agent_1: none" in "".join(map(chr, rows[0, "agent_0"].prompt_ids))
    assert rows[0, "agent_0"].reward == pytest.approx((0 + 1) / 2)
    assert rows[1, "agent_0"].reward == pytest.approx(1.0 + 0.5)  # right now, persuaded by agent_1
    assert rows[0, "agent_1"].reward == pytest.approx((1 + 1) / 2) and rows[1, "agent_1"].reward == 1.0
    assert rows[1, "agent_0"].info["incentive"] == 0.5 and rows[1, "agent_0"].success


def test_the_majority_of_the_last_round_decides_success():
    episode, _, _ = play(make(roles=("a", "b", "c"), turns=1), {"a": ["#### 5"], "b": ["#### 1"], "c": ["#### 2"]})
    assert episode.done and not episode.success


def test_one_agent_is_no_debate():
    with pytest.raises(Exception, match="at least two agents"):
        make(roles=("agent_0",))


def test_marl_train_debates(tmp_path):
    done = cli("train", *[o for o in FAST if o != "env.size=4"], "env=math", "workflow=debate", "trainer.steps=1",
               "workflow.w_lead=0.5", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    step = step_records(tmp_path)[0]
    assert "train/agent_0/reward" in step and "train/agent_1/reward" in step
