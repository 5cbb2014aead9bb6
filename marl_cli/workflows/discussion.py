"""Discussion with interaction rewards (CoMAS: Xue et al., "Co-Evolving Multi-Agent Systems via Interaction Rewards",
arXiv 2510.08529; code xxyQwQ/CoMAS, its ``comas`` workflow and ``CoMASReward``): agents solve, evaluate each other's
solutions and score them, and the scores are the only rewards.

N agents (``workflow.roles``) discuss a task over R rounds. A round is three turns (``workflow.max_turns`` = 3·R), in
each of which every agent acts at once:

    solve:    each agent answers, shown the last round's solutions and their evaluations (``{discussion}``)
    evaluate: agent i evaluates the solution of agent i+1 (mod N): ``{solution}``
    score:    agent i scores the solution of agent i+2 (mod N) given its evaluation (``{solution}``, ``{evaluation}``),
              ending with the verdict line (``Score: {score}``, 1–3: 3 right, 2 minor flaws, 1 a fatal error)

CoMAS draws the evaluator and the scorer of each solution at random (each agent evaluates one and scores one per
round); marl rotates, so with two agents each scores its own solution after the other has evaluated it (a draw CoMAS
allows too). With s = (g − low)/(high − low) the normalised score g of solution j (CoMAS: (g − 1)/2):

    solver of j: s          evaluator of j: 1 − s          scorer of j: 0
    a score that does not parse (or lies out of range): solver 0, evaluator 0, scorer −1

written once the episode is over (``settle``). The env's program pays nobody: it checks every solution (``right`` in
the row info), so the scores' agreement with it is logged each step (``train/discussion/agreement``: the share of
parsed scores where "s ≥ ½" equals the program's verdict), and an episode succeeds when a majority of the last round's
solutions are right (CoMAS reports the share right: ``train/discussion/final_right``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.core.verdicts import Scale, check_asks_verdict, check_verdict
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

PHASES = ("solve", "evaluate", "score")
"""The turns of a round, in order; agent i's target in each: its own solution, then i+1's, then i+2's."""


@dataclass
class DiscussionConfig(WorkflowConfig):
    """CoMAS's discussion (``workflow=discussion``): the agents, the rounds (3 turns each) and the scorer's verdict."""

    verdict: str = "Score: {score}"  # the scorer's last line; {score} is where its number goes
    low: float = 1.0  # the lowest score (a fatal error)
    high: float = 3.0  # the highest (right)
    # the solve turn's template; fields as any prompt's plus {discussion} (the last round's solutions, evaluations)
    solve_prompt: str = "{rules}\n{observation}\nDiscussion: {discussion}\nAnswer after {marker}.\n"
    # the evaluate turn's template; fields as any prompt's plus {solution} (the one it evaluates)
    evaluate_prompt: str = "{observation}\nSolution: {solution}\nPoint out its errors.\n"
    # the score turn's template; fields as any prompt's plus {solution}, {evaluation} and {verdict} (the score line)
    score_prompt: str = "{observation}\nSolution: {solution}\nEvaluation: {evaluation}\nEnd with {verdict}.\n"


def check_discussion(cfg: Any) -> None:
    """Whole rounds, two agents at least, a verdict line with one slot that the score prompt asks for."""
    wf = cfg.workflow
    if wf.max_turns % len(PHASES):
        raise ConfigError(f"workflow=discussion plays rounds of 3 turns (solve, evaluate, score): workflow.max_turns="
                          f"{wf.max_turns} is not a multiple of 3")
    if len(wf.roles) < 2:
        raise ConfigError(f"workflow=discussion needs at least two agents in workflow.roles, got {list(wf.roles)}")
    check_verdict(wf.verdict, "workflow.verdict")
    check_asks_verdict(wf.score_prompt, "workflow.score_prompt", "scorer")


@WORKFLOWS.register("discussion", schema=DiscussionConfig, check=check_discussion)
class DiscussionWorkflow(Workflow):
    """Every agent solves, evaluates another's solution and scores a third's, round after round."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        self.scale = Scale(cfg.verdict, cfg.low, cfg.high)

    def stages(self, turn: int) -> list[list[str]]:
        return [list(self.roles)]

    def _phase(self, state: TeamState) -> int:
        return int(state.notes.get("turn", "0")) % len(PHASES)

    def target(self, role: str, phase: int) -> str:
        """The agent whose solution ``role`` answers for (phase 0), evaluates (1) or scores (2)."""
        return self.roles[(self.roles.index(role) + phase) % len(self.roles)]

    def prompt(self, role: str, state: TeamState) -> str:
        phase = self._phase(state)
        target = self.target(role, phase)
        notes = state.notes
        discussion = "; ".join(f"{r}: {notes[f'solution:{r}']} ({notes.get(f'evaluation:{r}', 'none')})"
                               for r in self.roles if f"solution:{r}" in notes) or "none"
        fields = {"discussion": discussion, "solution": notes.get(f"solution:{target}", "none"),
                  "evaluation": notes.get(f"evaluation:{target}", "none"), "verdict": self.scale.instruction}
        template = (self.cfg.solve_prompt, self.cfg.evaluate_prompt, self.cfg.score_prompt)[phase]
        return self.render(role, state, fields, template)

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        phase = self._phase(state)
        target = self.target(role, phase)
        info: dict[str, float] = {"phase": float(phase), "target": float(self.roles.index(target))}
        format_ok, solved, reward = True, False, 0.0
        if phase == 0:
            answer = self.parse(text)
            t = self.env.step(state.env, answer)  # on a copy: the task stays as it is for every agent and round
            format_ok, solved = t.format_ok, t.success
            notes = {f"solution:{role}": answer or "none", f"right:{role}": str(float(t.success))}
        elif phase == 1:
            notes = {f"evaluation:{target}": text.strip() or "none"}
        else:
            score, _ = self.scale.parse(text)
            format_ok = score is not None
            reward = 0.0 if format_ok else -1.0
            info["score"] = -1.0 if score is None else score
            notes = {f"score:{target}": "none" if score is None else str(score)}
        info["right"] = float(state.notes.get(f"right:{target}", "0")) if phase else float(solved)
        new = replace(state, notes={**state.notes, **notes})
        if role == self.roles[-1]:
            new = self._next_turn(new)
        return Outcome(new, reward, reward, 0.0, format_ok, info, solved)

    def _next_turn(self, state: TeamState) -> TeamState:
        """The stage is over: the next turn; after the last, the episode ends, won by a majority right."""
        turn = int(state.notes.get("turn", "0")) + 1
        done = turn >= self.max_turns
        right = sum(float(state.notes.get(f"right:{r}", "0")) for r in self.roles)
        return replace(state, notes={**state.notes, "turn": str(turn)}, done=done,
                       success=done and right > len(self.roles) / 2)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """Each solution's score pays its solver s and its evaluator 1 − s (0 each when the score did not parse)."""
        scores = {(row.turn // len(PHASES), row.info["target"]): row.info["score"]
                  for row in rows if row.info["phase"] == 2.0}
        for row in rows:
            phase = int(row.info["phase"])
            if phase == 2:
                continue
            score = scores.get((row.turn // len(PHASES), row.info["target"]), -1.0)
            row.reward = 0.0 if score < 0 else score if phase == 0 else 1.0 - score
            row.info["score"] = score

    def step_metrics(self, rows: list[Sample], prefix: str) -> dict[str, float]:
        """The scores' agreement with the program, their mean, and the share of the last round's solutions right."""
        scored = [row for row in rows if row.info.get("phase") == 2.0 and row.info["score"] >= 0]
        last = max((row.turn for row in rows), default=0) // len(PHASES) * len(PHASES)
        final = [row for row in rows if row.info.get("phase") == 0.0 and row.turn == last]
        metrics = {}
        if scored:
            agree = sum((row.info["score"] >= 0.5) == (row.info["right"] == 1.0) for row in scored)
            metrics[f"{prefix}/discussion/agreement"] = agree / len(scored)
            metrics[f"{prefix}/discussion/score"] = sum(row.info["score"] for row in scored) / len(scored)
        if final:
            metrics[f"{prefix}/discussion/final_right"] = sum(row.info["right"] for row in final) / len(final)
        return metrics

    def practice_states(self, role: str, state: TeamState) -> list[TeamState]:
        """Evaluating and scoring, an agent also practises on a wrong solution (the oracle's are always right)."""
        phase = self._phase(state)
        if phase == 0:
            return []
        target = self.target(role, phase)
        wrong = self.wrong_answer(state)
        if wrong is None:
            return []
        return [replace(state, notes={**state.notes, f"solution:{target}": wrong, f"right:{target}": "0.0"})]

    def demonstration(self, role: str, state: TeamState) -> str | None:
        """Solving: the oracle's answer; evaluating and scoring: the program's verdict on the target's solution."""
        phase = self._phase(state)
        if phase == 0:
            answer = self.env.oracle(state.env)
            return None if answer is None else self.format_answer(answer)
        right = state.notes.get(f"right:{self.target(role, phase)}") == "1.0"
        if phase == 1:
            return "The solution is right." if right else "The solution is wrong."
        return self.scale.line(self.cfg.high if right else self.cfg.low)
