"""Proposer, solver and judge from one model (Multi-Agent Evolve, arXiv 2510.23595; code ulab-uiuc/Multi-agent-evolve,
``GeneralIORewardManager``): the team writes its tasks, answers them and grades the answers.

Roles ``[proposer, solver, judge]`` (MAE) or ``[solver, judge]`` (the env's own tasks, the judge grading the
solver: a solver trained on a judge's reward). With a proposer an episode has two turns:

    turn 0: the proposer writes a task, once per task (as in ``propose_solve``: the family's program checks it,
            ``Env.parse_task``, and a rejected one ends the task's episodes); the judge grades the question, once;
    turn 1: the solver answers (each of the K episodes of the task); the judge grades the answer.

Without a proposer the one turn is the second. The judge ends its reply with ``workflow.verdict`` (``Score:
{score}``, a number on [low, high]); its grade q ∈ [0, 1] is the number mapped onto [0, 1], or
``workflow.invalid_score`` where the line is missing or out of range (MAE's neutral fallback). Rewards:

    solver:   ½·q_answer + ½·format                  (``solver_reward=judge``, MAE's; format: an answer was given)
              the env's reward                        (``solver_reward=program``: the judge grades but does not pay)
    proposer: (q_question + d + 1) / 3,  d = 1 − mean q_answer over the task's K episodes,
              d = 0 when q_question < ``quality_threshold`` (MAE's 0.7: a poor question earns no difficulty);
              ``invalid_reward`` for a proposal the program rejects (MAE pays 0 for one without a question)
    judge:    1 when its verdict line parses and lies in range, else 0          (``judge_reward=format``, MAE's)
              grading an answer: 1 when "q ≥ ``agreement_threshold``" equals the program's verdict, else 0
              (``agreement``: the judge trained toward the program where one exists); grading a question: format

The program's verdict on every answer is kept (``success``, and ``program`` in the solver's row info), so the
judge's agreement with it is logged each step (``train/judge/agreement``: reward hacking shows as agreement falling
while the solver's judged reward rises). The judge is any policy of the run: the shared model (role-conditioned by
its prompt), its own (``policy=per_role``), or frozen (``trainer.frozen_roles=[judge]``). Evaluations skip the
proposer and the judge: the solver answers the env's held-out tasks and the program scores them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig, bounded, choices
from marl_cli.core.samples import Sample
from marl_cli.core.verdicts import Scale, check_asks_verdict, check_verdict
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState
from marl_cli.workflows.propose_solve import ProposeSolveWorkflow, check_self_made

SolverReward = choices("SolverReward", "judge", "program", module=__name__)
JudgeReward = choices("JudgeReward", "format", "agreement", module=__name__)
RUBRICS = ("rubric", "question_rubric")


@dataclass
class ProposeSolveJudgeConfig(WorkflowConfig):
    """MAE's proposer, solver and judge (``workflow=propose_solve_judge``)."""

    invalid_reward: float = 0.0  # the proposer's reward for a proposal the family's program rejects
    solver_reward: SolverReward = SolverReward.judge  # ½·judge grade + ½·format, or the env's reward
    judge_reward: JudgeReward = JudgeReward.format  # a well-formed verdict, or agreement with the program
    verdict: str = "Score: {score}"  # the judge's last line; {score} is where its number goes
    low: float = 0.0  # the lowest score the judge may give
    high: float = 10.0  # the highest
    invalid_score: float = bounded(0.5, ge=0.0, le=1.0)  # the grade of a verdict that does not parse
    quality_threshold: float = bounded(0.7, ge=0.0, le=1.0)  # a question graded below earns no difficulty reward
    agreement_threshold: float = bounded(0.5, ge=0.0, le=1.0)  # a grade at least this says "right"
    # the judge's template grading an answer; fields as any prompt's plus {verdict}
    rubric: str = "{observation}\nAnswer: {solver}\nIs it right? End with {verdict}.\n"
    # the judge's template grading a proposed question; fields as any prompt's plus {verdict}
    question_rubric: str = "Question: {proposer}\nIs it a good question? End with {verdict}.\n"


def check_propose_solve_judge(cfg: Any) -> None:
    """Roles and turns as the workflow plays them, a verdict line with one slot, rubrics that ask for it, and the
    self-made-task checks where there is a proposer."""
    wf = cfg.workflow
    proposer = "proposer" in wf.roles
    if wf.max_turns != (2 if proposer else 1):
        raise ConfigError(f"workflow=propose_solve_judge plays {'2 turns (question, answer)' if proposer else '1 turn'}"
                          f" with roles {list(wf.roles)}: set workflow.max_turns={2 if proposer else 1}")
    check_verdict(wf.verdict, "workflow.verdict")
    for key in RUBRICS:
        check_asks_verdict(wf[key], f"workflow.{key}")
    if proposer:
        check_self_made(cfg, ["proposer", "judge"])


@WORKFLOWS.register("propose_solve_judge", schema=ProposeSolveJudgeConfig, check=check_propose_solve_judge)
class ProposeSolveJudgeWorkflow(ProposeSolveWorkflow):
    """``proposer`` writes the task (once), ``judge`` grades it (once), ``solver`` answers, ``judge`` grades that."""

    train_only = ("proposer", "judge")
    role_lists = (["proposer", "solver", "judge"], ["solver", "judge"])

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        self.scale = Scale(cfg.verdict, cfg.low, cfg.high)
        self.proposing = "proposer" in self.roles

    def stages(self, turn: int) -> list[list[str]]:
        if self.proposing and turn == 0:
            return [["proposer"], ["judge"]]
        return [["solver"], ["judge"]]

    def once_per_task(self, role: str, state: TeamState) -> bool:
        """The proposer, and the judge while it grades the question (before any answer)."""
        return role == "proposer" or (role == "judge" and "solver" not in state.notes)

    def prompt(self, role: str, state: TeamState) -> str:
        if role != "judge":
            return self.render(role, state)
        template = self.cfg.rubric if "solver" in state.notes else self.cfg.question_rubric
        return self.render(role, state, {"verdict": self.scale.instruction}, template)

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        if role == "proposer":
            return self._propose(state, text)
        if role == "judge":
            return self._grade(state, text)
        answer = self.parse(text)
        t = self.env.step(state.env, answer)  # on a copy: the judge still sees the question
        new = replace(state, success=t.success).with_note("solver", answer or "none")
        return Outcome(new, t.reward, t.reward, 0.0, t.format_ok, {**t.info, "program": t.reward}, t.success)

    def _grade(self, state: TeamState, text: str) -> Outcome:
        """The judge's grade, kept in the state (``quality`` for a question, ``grade`` for an answer)."""
        score, _ = self.scale.parse(text)
        parsed = score is not None
        grade = score if parsed else self.cfg.invalid_score
        if "solver" not in state.notes:
            new = state.with_note("quality", str(grade))
            return Outcome(new, float(parsed), float(parsed), 0.0, parsed, {"question": 1.0, "score": grade})
        agrees = parsed and (score >= self.cfg.agreement_threshold) == state.success
        reward = float(agrees) if self.cfg.judge_reward == "agreement" else float(parsed)
        new = replace(state.with_note("grade", str(grade)), done=True)
        return Outcome(new, reward, reward, 0.0, parsed, {"question": 0.0, "score": grade, "agreement": float(agrees)})

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """The solver's reward from the judge's grade of its answer (``solver_reward=judge``)."""
        grade = float(state.notes.get("grade", self.cfg.invalid_score))
        for row in rows:
            if row.role == "solver":
                row.info["judge_score"] = grade
                if self.cfg.solver_reward == "judge":
                    row.reward = 0.5 * grade + 0.5 * float(row.format_ok)

    def settle_task(self, finals: list[TeamState], rows: list[Sample]) -> None:
        """The proposer's reward: the judge's quality grade, the difficulty its answers' grades show, the format."""
        proposals = [row for row in rows if row.role == "proposer" and row.info.get("valid") == 1.0]
        if not proposals:
            return
        quality = float(finals[0].notes["quality"])
        solved = sum(float(s.notes.get("grade", self.cfg.invalid_score)) for s in finals) / len(finals)
        difficulty = 1.0 - solved if quality >= self.cfg.quality_threshold else 0.0
        for row in proposals:
            row.reward = (quality + difficulty + 1.0) / 3.0
            row.info.update(quality=quality, difficulty=difficulty, solve_rate=sum(s.success for s in finals)
                            / len(finals))

    def step_metrics(self, rows: list[Sample], prefix: str) -> dict[str, float]:
        """The judge's agreement with the program on answers, its parse failures, its mean grades."""
        metrics = super().step_metrics(rows, prefix)
        judged = [row for row in rows if row.role == "judge"]
        answers = [row for row in judged if row.info.get("question") == 0.0]
        questions = [row for row in judged if row.info.get("question") == 1.0]
        if judged:
            metrics[f"{prefix}/judge/parse_failures"] = sum(not row.format_ok for row in judged) / len(judged)
        if answers:
            metrics[f"{prefix}/judge/agreement"] = sum(row.info["agreement"] for row in answers) / len(answers)
            metrics[f"{prefix}/judge/answer_score"] = sum(row.info["score"] for row in answers) / len(answers)
        if questions:
            metrics[f"{prefix}/judge/question_score"] = sum(row.info["score"] for row in questions) / len(questions)
        return metrics

    def practice_states(self, role: str, state: TeamState) -> list[TeamState]:
        """Grading an answer, the judge also practises on a wrong one (the oracle's answers are always right)."""
        if role != "judge" or "solver" not in state.notes:
            return []
        wrong = self.wrong_answer(state)
        return [] if wrong is None else [replace(state, success=False).with_note("solver", wrong)]

    def demonstration(self, role: str, state: TeamState) -> str | None:
        """The judge: the highest score for a question the program accepted, and the program's verdict (highest or
        lowest) for an answer; the others as in ``propose_solve``."""
        if role != "judge":
            return super().demonstration(role, state)
        right = "solver" not in state.notes or state.success
        return self.scale.line(self.cfg.high if right else self.cfg.low)
