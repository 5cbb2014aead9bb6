"""MAE's proposer–solver–judge workflow: the judge grades the question once and each answer; the rewards of all three
roles against hand-computed values; the judge-only variant on the env's tasks; the judge's warm start; refusals."""

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
from marl_cli.workflows.propose_solve_judge import ProposeSolveJudgeConfig, ProposeSolveJudgeWorkflow
from tests.helpers import FAST, ScriptedGenerator, cli, refusal, step_records

YAML = OmegaConf.load(config_dir() / "workflow" / "propose_solve_judge.yaml")
SEED = MathTask("What is 2 + 3?", "5", "2 + 3")
NON_GRID = [o for o in FAST if o != "env.size=4"]


def workflow(roles=("proposer", "solver", "judge"), **kw) -> ProposeSolveJudgeWorkflow:
    fields = {k: YAML[k] for k in ("prompts", "rubric", "question_rubric")}
    cfg = OmegaConf.structured(ProposeSolveJudgeConfig(name="propose_solve_judge", roles=list(roles), alpha=0.0,
                                                       max_turns=2 if "proposer" in roles else 1, **fields, **kw))
    return ProposeSolveJudgeWorkflow(cfg, MathEnv(MathConfig(actions_per_episode=1, kinds=["arithmetic"])))


def play(flow, tasks, k, answer, evaluating=False):
    """Play ``tasks`` with K = ``k``; every role answers with ``answer(role, prompt, rng)``."""
    gen = ScriptedGenerator(answer)
    policies = {r: SimpleNamespace(name=r) for r in flow.roles}
    rollout = Rollout(flow, policies, {r: r for r in flow.roles}, gen, Sampling(1.0))
    if evaluating:
        rollout = rollout.evaluation()
    return rollout.play(tasks, k, random.Random(0)), gen


def graded(answers: dict[str, str], question: str = "Score: 8"):
    """A script: the proposal ``12 - 4`` (value 8), the question graded ``question``, the answers of the episodes in
    turn from ``answers`` (answer → the judge's reply to it)."""
    replies = iter(["#### 8", "#### 8", "#### 3", "#### many"])

    def answer(role, prompt, rng):
        if role == "proposer":
            return "#### 12 - 4"
        if role == "solver":
            return next(replies)
        if "Is the answer right" not in prompt:
            return question
        return answers[prompt.split("Answer: ")[1].split("\n")[0]]
    return answer


def test_the_judge_grades_the_question_once_and_every_answer_and_pays_all_three_roles():
    flow = workflow()
    result, gen = play(flow, [SEED], 4, graded({"8": "ok Score: 10", "3": "Score: 2", "many": "no"}))
    rows = result.samples
    assert gen.batches == [("proposer", 1), ("judge", 1), ("solver", 4), ("judge", 4)]
    proposer = [s for s in rows if s.role == "proposer"]
    question = [s for s in rows if s.role == "judge" and s.turn == 0]
    solver = sorted((s for s in rows if s.role == "solver"), key=lambda s: s.branch)
    answers = sorted((s for s in rows if s.role == "judge" and s.turn == 1), key=lambda s: s.branch)
    assert len(proposer) == len(question) == 1 and len(solver) == len(answers) == 4
    # grades: 1.0, 1.0, 0.2, and 0.5 (no verdict line: invalid_score); "many" does not parse as a number
    assert [s.info["judge_score"] for s in solver] == [1.0, 1.0, 0.2, 0.5]
    formats = [s.format_ok for s in solver]
    assert [s.reward for s in solver] == pytest.approx([0.5 * g + 0.5 * f for g, f in
                                                        zip([1.0, 1.0, 0.2, 0.5], formats, strict=True)])
    assert [s.success for s in solver] == [True, True, False, False]  # the program's verdicts, kept
    # the proposer: (quality 0.8 + difficulty (1 − mean grade 0.675) + format 1) / 3
    assert proposer[0].reward == pytest.approx((0.8 + (1 - 0.675) + 1) / 3)
    assert question[0].reward == 1.0 and [s.reward for s in answers] == [1.0, 1.0, 1.0, 0.0]  # format rewards
    metrics = rollout_metrics(result, "train", flow)
    assert metrics["train/judge/agreement"] == pytest.approx(3 / 4)  # 10, 10 and 2 agree; no verdict does not
    assert metrics["train/judge/parse_failures"] == pytest.approx(1 / 5)
    assert metrics["train/judge/question_score"] == pytest.approx(0.8)
    assert metrics["train/proposer/valid"] == 1.0 and metrics["train/proposer/solve_rate"] == 0.5


def test_a_question_graded_below_the_threshold_earns_no_difficulty():
    result, _ = play(workflow(), [SEED], 2, graded({"8": "Score: 10"}, question="Score: 6"))
    proposer = next(s for s in result.samples if s.role == "proposer")
    assert proposer.reward == pytest.approx((0.6 + 0.0 + 1) / 3) and proposer.info["difficulty"] == 0.0


def test_the_agreement_reward_pays_the_judge_for_matching_the_program():
    flow = workflow(judge_reward="agreement")
    result, _ = play(flow, [SEED], 3, graded({"8": "Score: 3", "3": "Score: 1"}))
    answers = sorted((s for s in result.samples if s.role == "judge" and s.turn == 1), key=lambda s: s.branch)
    assert [s.reward for s in answers] == [0.0, 0.0, 1.0]  # 0.3 on right answers disagrees; 0.1 on the wrong agrees


def test_program_rewards_leave_the_solver_the_envs_reward():
    result, _ = play(workflow(solver_reward="program"), [SEED], 3, graded({"8": "Score: 0", "3": "Score: 10"}))
    solver = sorted((s for s in result.samples if s.role == "solver"), key=lambda s: s.branch)
    assert [s.reward for s in solver] == [1.0, 1.0, 0.0] and [s.info["judge_score"] for s in solver] == [0, 0, 1]


def test_a_rejected_proposal_ends_the_task_before_the_judge():
    result, gen = play(workflow(), [SEED], 3, lambda role, prompt, rng: "#### 2 ** 3")
    assert gen.batches == [("proposer", 1)] and [s.reward for s in result.samples] == [0.0]


def test_without_a_proposer_the_judge_grades_the_envs_tasks_and_evaluation_skips_it():
    flow = workflow(roles=("solver", "judge"))
    task = MathTask("What is 4 + 4?", "8", "4 + 4")
    result, gen = play(flow, [task, task], 2, graded({"8": "Score: 9", "3": "Score: 9", "many": "Score: 0"}))
    assert gen.batches == [("solver", 4), ("judge", 4)]
    assert all(ep.done for ep in result.episodes)
    metrics = rollout_metrics(result, "train", flow)
    assert metrics["train/judge/agreement"] == pytest.approx(3 / 4)  # 9 says right: wrong on the answer "3"
    evaluated, gen = play(flow, [task], 1, graded({}), evaluating=True)
    assert gen.batches == [("solver", 1)] and evaluated.episodes[0].success


def test_the_judges_warm_start_grades_right_and_wrong_answers_by_the_program():
    flow = workflow(roles=("solver", "judge"))
    state = flow.act("solver", flow.initial_state(MathTask("What is 4 + 4?", "8", "4 + 4")), "#### 8").state
    assert flow.demonstration("judge", state) == "Score: 10"
    (wrong,) = flow.practice_states("judge", state)
    assert not wrong.success and wrong.notes["solver"] != "8" and flow.demonstration("judge", wrong) == "Score: 0"
    assert "Answer: " + wrong.notes["solver"] in flow.prompt("judge", wrong)
    assert flow.practice_states("solver", state) == []


@pytest.mark.parametrize(("overrides", "message"), [
    (["workflow.verdict=Score"], "workflow.verdict='Score' needs exactly one {score} slot (where the judge writes its "
                                 "number) and no other field, e.g. 'Score: {score}'"),
    (["workflow.rubric='{observation} {solver}'"], "workflow.rubric never tells the judge how to write its score: "
                                                   "add the {verdict} field"),
    (["workflow.max_turns=1"], "workflow=propose_solve_judge plays 2 turns (question, answer) with roles "
                               "['proposer', 'solver', 'judge']: set workflow.max_turns=2"),
    (["algorithm.batch_roles=[proposer]"], "workflow=propose_solve_judge: the judge acts once a task (one row each), "
                                           "so the baseline is across tasks: set algorithm.batch_roles=[proposer, "
                                           "judge] (algorithm=grpo or at_grpo)"),
])
def test_a_propose_solve_judge_config_that_cannot_work_is_refused(overrides, message):
    both = [] if any("batch_roles" in o for o in overrides) else ["algorithm.batch_roles=[proposer,judge]"]
    assert refusal([*NON_GRID, "env=math", "workflow=propose_solve_judge", *both, *overrides]) == message


def test_marl_train_runs_the_three_roles(tmp_path):
    done = cli("train", *NON_GRID, "env=math", "env.kinds=[add_sub]", "workflow=propose_solve_judge",
               "algorithm.batch_roles=[proposer,judge]", "+policy.scripted.proposer=oracle", "trainer.steps=1",
               f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    step = step_records(tmp_path)[0]
    assert {"train/proposer/reward", "train/judge/reward", "train/solver/reward", "train/proposer/valid"} <= set(step)


def test_the_warm_start_teaches_the_judge_right_and_wrong_answers_half_and_half():
    from marl_cli.training.warmstart import demonstrations

    flow = workflow(roles=("solver", "judge"))
    data = demonstrations(flow, ["solver", "judge"], 20, Sampling(0.0, use_chat_template=False),
                          SimpleNamespace(tokenizer=None), chunk=10)
    verdicts = [c for c in data["completion"] if c.startswith("Score: ")]
    assert len(data) == 40 and len(verdicts) == 20
    assert verdicts.count("Score: 10") == verdicts.count("Score: 0") == 10  # each right answer beside a wrong one
