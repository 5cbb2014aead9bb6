"""The proposer–solver workflow (SSP): one proposal a task, checked by the family's program, solved K times; the
proposer paid 1 − the solve rate; evaluations without the proposer; the engine's once-per-task roles."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.algorithms.grpo import assign_advantages
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import MathConfig
from marl_cli.envs.math_data import MathTask
from marl_cli.envs.math_problems import MathEnv
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.workflows.propose_solve import ProposeSolveConfig, ProposeSolveWorkflow
from tests.helpers import FAST, ScriptedGenerator, refusal

PROMPTS = dict(OmegaConf.load(config_dir() / "workflow" / "propose_solve.yaml").prompts)
SEED = MathTask("What is 2 + 3?", "5", "2 + 3")


def workflow(reward: str = "one_minus_success", turns: int = 1) -> ProposeSolveWorkflow:
    cfg = OmegaConf.structured(ProposeSolveConfig(name="propose_solve", roles=["proposer", "solver"], max_turns=turns,
                                                  alpha=0.0, prompts=PROMPTS, proposer_reward=reward))
    return ProposeSolveWorkflow(cfg, MathEnv(MathConfig(actions_per_episode=turns, kinds=["arithmetic"])))


def play(flow, tasks, k, proposals, solve, evaluating=False):
    """Play ``tasks`` with K = ``k``: the proposer answers from ``proposals`` (in order), the solver with
    ``solve(prompt, rng)``."""
    script = iter(proposals)

    def answer(policy, prompt, rng):
        return next(script) if policy == "proposer" else solve(prompt, rng)

    gen = ScriptedGenerator(answer)
    policies = {r: SimpleNamespace(name=r) for r in ("proposer", "solver")}
    rollout = Rollout(flow, policies, {"proposer": "proposer", "solver": "solver"}, gen, Sampling(1.0))
    if evaluating:
        rollout = rollout.evaluation()
    return rollout.play(tasks, k, random.Random(0)), gen


def test_the_proposer_acts_once_a_task_and_every_episode_solves_its_proposal():
    # 12 - 4 = 8 and 6 * 3 = 18 lie on the training side of the generator's split
    result, gen = play(workflow(), [SEED, SEED], 4, ["#### 12 - 4 = 8", "#### 6 * 3 = 18"],
                       lambda prompt, rng: "#### 8" if "12 - 4" in prompt else rng.choice(["#### 18", "#### 0"]))
    proposer = [s for s in result.samples if s.role == "proposer"]
    solver = [s for s in result.samples if s.role == "solver"]
    assert [(s.task, s.branch) for s in proposer] == [(0, 0), (1, 0)]
    assert len(solver) == 8 and gen.batches == [("proposer", 2), ("solver", 8)]
    for task, question in ((0, "What is 12 - 4?"), (1, "What is 6 * 3?")):
        mine = [s for s in solver if s.task == task]
        assert len({tuple(s.prompt_ids) for s in mine}) == 1 and question in "".join(map(chr, mine[0].prompt_ids))
    solved = [sum(s.success for s in solver if s.task == t) / 4 for t in (0, 1)]
    assert solved[0] == 1.0 and proposer[0].reward == 0.0 and proposer[0].info["solve_rate"] == 1.0
    assert proposer[1].reward == pytest.approx(1 - solved[1]) and proposer[1].info["valid"] == 1.0
    assert all(s.reward == (1.0 if s.success else 0.0) for s in solver)


@pytest.mark.parametrize("proposal", ["#### 12 - 4 = 9", "#### 9**9**9", "#### 100 + 1", "no marker", "#### 3+4*2",
                                      "#### 12", "#### 5 / 0"])
def test_a_proposal_the_program_rejects_ends_the_task_and_costs_the_proposer(proposal):
    # a wrong stated answer, a power, a number above max_operand, no answer, a question of the held-out side, no
    # operator, a division by zero
    result, gen = play(workflow(), [SEED], 3, [proposal], lambda prompt, rng: "#### 7")
    assert [s.role for s in result.samples] == ["proposer"] and gen.batches == [("proposer", 1)]
    row = result.samples[0]
    assert row.reward == -1.0 and not row.format_ok and row.info["valid"] == 0.0
    assert all(ep.done and not ep.success for ep in result.episodes)


def test_the_intermediate_difficulty_reward_peaks_at_half_solved():
    solves = iter(["#### 8", "#### 0", "#### 8", "#### 0"])
    result, _ = play(workflow("intermediate"), [SEED], 4, ["#### 12 - 4 = 8"], lambda prompt, rng: next(solves))
    assert result.samples[0].reward == pytest.approx(4 * 0.5 * 0.5)


def test_evaluation_skips_the_proposer_and_the_solver_answers_the_envs_task():
    result, gen = play(workflow(), [SEED], 1, [], lambda prompt, rng: "#### 5", evaluating=True)
    assert [s.role for s in result.samples] == ["solver"] and result.episodes[0].success
    assert gen.batches == [("solver", 1)]
    assert "What is 2 + 3?" in "".join(map(chr, result.samples[0].prompt_ids))


def test_the_solver_answers_again_on_later_turns_the_proposer_does_not():
    answers = iter(["#### 0", "#### 8"])
    result, _ = play(workflow(turns=2), [SEED], 1, ["#### 12 - 4 = 8"], lambda prompt, rng: next(answers))
    assert [(s.turn, s.role) for s in result.samples] == [(0, "proposer"), (0, "solver"), (1, "solver")]
    assert result.episodes[0].success and result.samples[0].reward == 0.0


def test_an_expression_alone_is_a_task_whose_answer_the_program_computes():
    result, _ = play(workflow(), [SEED], 2, ["#### 12 - 4"], lambda prompt, rng: "#### 8")
    assert [s.role for s in result.samples] == ["proposer", "solver", "solver"]
    assert all(s.success for s in result.samples if s.role == "solver") and result.samples[0].reward == 0.0


def test_demonstrations_are_valid_proposals_and_oracle_answers():
    flow = workflow()
    state = flow.initial_state(SEED)
    proposal = flow.demonstration("proposer", state)
    assert proposal.startswith("#### ") and "=" not in proposal
    assert flow.env.parse_task(flow.parse(proposal)) is not None
    assert flow.demonstration("solver", state) == "#### 5"


def test_batch_roles_give_the_proposer_one_baseline_across_tasks():
    result, _ = play(workflow(), [SEED, SEED], 2, ["#### 12 - 4 = 8", "#### 1 = 1"], lambda prompt, rng: "#### 0")
    rows = result.samples  # task 0: valid, unsolved (reward 1); task 1: invalid (reward -1)
    assign_advantages(rows, norm_by_std=False, batch_roles=["proposer"])
    proposer = [s for s in rows if s.role == "proposer"]
    assert [s.advantage for s in proposer] == [1.0, -1.0]  # r − mean over both tasks' proposals
    assign_advantages(rows, norm_by_std=False)
    assert [s.advantage for s in proposer] == [0.0, 0.0]  # a group of one each: no signal


def test_a_proposed_grid_is_solved_on_plan_path():
    from marl_cli.config.schema import PlanPathConfig
    from marl_cli.envs.plan_path import PlanPathEnv

    env = PlanPathEnv(PlanPathConfig(size=3, eval_size=5, actions_per_episode=1))
    cfg = OmegaConf.structured(ProposeSolveConfig(name="propose_solve", roles=["proposer", "solver"], max_turns=1,
                                                  alpha=0.0, prompts=PROMPTS))
    flow = ProposeSolveWorkflow(cfg, env)
    result, _ = play(flow, [env.task("train", 0)], 2, ["#### S . . / # # . / G . .", "unused"],
                     lambda prompt, rng: "#### R R D D L L" if "G . ." in prompt else "#### U")
    solver = [s for s in result.samples if s.role == "solver"]
    assert len(solver) == 2 and all(s.success for s in solver)  # the proposed grid is what the solver walked
    assert next(s for s in result.samples if s.role == "proposer").reward == 0.0  # solved by both: 1 − 1


@pytest.mark.parametrize(("overrides", "message"), [
    (["workflow=propose_solve", "env=sudoku"],
     "workflow=propose_solve needs an env whose tasks a model can write; env=sudoku cannot (choose from: math, "
     "plan_path)"),
    (["workflow=propose_solve", "env=math"],
     "workflow=propose_solve: the proposer acts once a task (one row each), so the baseline is across tasks: set "
     "algorithm.batch_roles=[proposer] (algorithm=grpo or at_grpo)"),
    (["workflow=propose_solve", "env=math", "algorithm=at_grpo", "algorithm.mode=tree",
      "algorithm.batch_roles=[proposer]"],
     "workflow=propose_solve needs algorithm.mode=independent: the solver's K episodes of a task share the "
     "proposer's one proposal"),
])
def test_a_propose_solve_config_that_cannot_work_is_refused(overrides, message):
    assert refusal([*[o for o in FAST if o != "env.size=4"], *overrides]) == message


def test_marl_train_proposes_solves_and_evaluates_the_solver_alone(tmp_path):
    from tests.helpers import cli, metric_records, step_records

    done = cli("train", *[o for o in FAST if o != "env.size=4"], "env=math", "env.kinds=[arithmetic]",
               "workflow=propose_solve", "algorithm.batch_roles=[proposer]", "trainer.steps=2",
               f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    step = step_records(tmp_path)[0]
    assert "train/proposer/format_failure" in step and "train/proposer/reward" in step
    evals = [r for r in metric_records(tmp_path) if "eval/success" in r]
    assert evals and all(not any(k.startswith("eval/proposer") for k in r) for r in evals)
