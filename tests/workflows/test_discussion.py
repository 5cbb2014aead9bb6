"""CoMAS's discussion: solve, evaluate and score in rotation; the interaction rewards against hand-computed values;
the scores' agreement with the program; the warm start's wrong solutions; refusals."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.config.paths import config_dir
from marl_cli.config.schema import MathConfig
from marl_cli.envs.math_data import MathTask
from marl_cli.envs.math_problems import MathEnv
from marl_cli.rollout.engine import Rollout, rollout_metrics
from marl_cli.rollout.generation import Sampling
from marl_cli.workflows.discussion import DiscussionConfig, DiscussionWorkflow
from tests.helpers import FAST, ScriptedGenerator, cli, refusal, step_records

YAML = OmegaConf.load(config_dir() / "workflow" / "discussion.yaml")
TASK = MathTask("What is 4 + 4?", "8", "4 + 4")
NON_GRID = [o for o in FAST if o != "env.size=4"]


def workflow(agents: int = 3, rounds: int = 1) -> DiscussionWorkflow:
    prompts = {k: YAML[k] for k in ("solve_prompt", "evaluate_prompt", "score_prompt")}
    cfg = OmegaConf.structured(DiscussionConfig(name="discussion", roles=[f"agent_{i}" for i in range(agents)],
                                                max_turns=3 * rounds, alpha=0.0, **prompts))
    return DiscussionWorkflow(cfg, MathEnv(MathConfig(actions_per_episode=1, kinds=["arithmetic"])))


def play(flow, script, k=1):
    """One task, K = ``k``; ``script(role, prompt)`` answers every prompt."""
    gen = ScriptedGenerator(lambda role, prompt, rng: script(role, prompt))
    policies = {r: SimpleNamespace(name=r) for r in flow.roles}
    return Rollout(flow, policies, {r: r for r in flow.roles}, gen, Sampling(1.0)).play([TASK], k, random.Random(0))


ANSWERS = {"agent_0": "#### 8", "agent_1": "#### 7", "agent_2": "#### 8"}


def three_agents(role: str, prompt: str) -> str:
    """agent_0 and agent_2 right, agent_1 wrong; each scorer gives 3 to an 8, 1 to a 7, except agent_0 (garbled)."""
    if "Answer after" in prompt:
        return ANSWERS[role]
    if "Point out" in prompt:
        return f"evaluation by {role}"
    if role == "agent_0":
        return "Score: nine"
    return "Score: 3" if "Solution: 8" in prompt else "Score: 1"


def test_each_agent_solves_evaluates_the_next_and_scores_the_one_after():
    flow = workflow()
    result = play(flow, three_agents)
    rows = {(s.turn, s.role): s for s in result.samples}
    assert sorted({s.turn for s in result.samples}) == [0, 1, 2] and len(rows) == 9
    # agent_i evaluates agent_{i+1}'s solution and scores agent_{i+2}'s
    assert [int(rows[1, f"agent_{i}"].info["target"]) for i in range(3)] == [1, 2, 0]
    assert [int(rows[2, f"agent_{i}"].info["target"]) for i in range(3)] == [2, 0, 1]
    # scores: agent_0 scores agent_2's solution (garbled); agent_1 scores agent_0's 8 (3 → 1.0); agent_2 agent_1's 7
    # (1 → 0.0)
    assert [rows[0, f"agent_{i}"].reward for i in range(3)] == [1.0, 0.0, 0.0]  # solver s; agent_2 unscored: 0
    # evaluators: agent_0 evaluated agent_1 (1 − 0.0), agent_1 agent_2 (unscored: 0), agent_2 agent_0 (1 − 1.0)
    assert [rows[1, f"agent_{i}"].reward for i in range(3)] == [1.0, 0.0, 0.0]
    assert [rows[2, f"agent_{i}"].reward for i in range(3)] == [-1.0, 0.0, 0.0]  # scorers: 0, or −1 unparsed
    assert result.episodes[0].done and result.episodes[0].success  # 2 of 3 final solutions right
    metrics = rollout_metrics(result, "train", flow)
    assert metrics["train/discussion/agreement"] == 1.0 and metrics["train/discussion/score"] == 0.5
    assert metrics["train/discussion/final_right"] == pytest.approx(2 / 3)


def test_later_rounds_see_the_last_rounds_solutions_and_evaluations():
    flow = workflow(agents=2, rounds=2)
    seen = []

    def script(role, prompt):
        seen.append(prompt)
        return three_agents(role, prompt)

    result = play(flow, script)
    assert max(s.turn for s in result.samples) == 5
    second = [p for p in seen if "Discussion so far" in p][2:]
    assert second and all("agent_0: 8 (evaluation by agent_1)" in p and "agent_1: 7" in p for p in second)
    # two agents: each scores its own solution (agent_1 scores 7 with a 1, agent_0 garbles its own)
    rows = {(s.turn, s.role): s for s in result.samples}
    assert rows[2, "agent_1"].info["target"] == 1.0 and rows[0, "agent_1"].reward == 0.0
    assert rows[1, "agent_0"].reward == 1.0  # agent_0 evaluated agent_1's 7, scored 1 → 1 − 0


def test_the_warm_start_also_shows_evaluators_and_scorers_a_wrong_solution():
    flow = workflow(agents=2)
    state = flow.initial_state(TASK)
    for role in flow.roles:
        state = flow.act(role, state, flow.demonstration(role, state)).state
    assert flow.demonstration("agent_0", state) == "The solution is right."
    (wrong,) = flow.practice_states("agent_0", state)
    assert wrong.notes["right:agent_1"] == "0.0" and flow.demonstration("agent_0", wrong) == "The solution is wrong."
    for role in flow.roles:
        state = flow.act(role, state, flow.demonstration(role, state)).state
    (wrong,) = flow.practice_states("agent_1", state)  # agent_1 scores agent_1's own (2 agents)
    assert flow.demonstration("agent_1", state) == "Score: 3" and flow.demonstration("agent_1", wrong) == "Score: 1"


@pytest.mark.parametrize(("overrides", "message"), [
    (["workflow.max_turns=4"], "workflow=discussion plays rounds of 3 turns (solve, evaluate, score): "
                               "workflow.max_turns=4 is not a multiple of 3"),
    (["workflow.roles=[agent_0]"], "workflow=discussion needs at least two agents in workflow.roles, got ['agent_0']"),
    (["workflow.score_prompt='{solution}'"], "workflow.score_prompt never tells the scorer how to write its score: "
                                             "add the {verdict} field"),
])
def test_a_discussion_config_that_cannot_work_is_refused(overrides, message):
    assert refusal([*NON_GRID, "env=math", "workflow=discussion", *overrides]) == message


def test_marl_train_discusses(tmp_path):
    done = cli("train", *NON_GRID, "env=math", "workflow=discussion", "workflow.max_turns=3", "trainer.steps=1",
               f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    step = step_records(tmp_path)[0]
    assert {"train/agent_0/reward", "train/agent_1/reward", "train/discussion/final_right"} <= set(step)
