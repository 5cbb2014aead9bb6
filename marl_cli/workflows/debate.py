"""Debate with a verifier and influence incentives (MAPoRL: Park et al., "Multi-Agent Post-Co-Training for
Collaborative LLMs with RL", arXiv 2502.18439; code chanwoo-park-official/MAPoRL).

N agents (``workflow.roles``) answer the same question over T rounds (``workflow.max_turns``); in each round they act
in parallel, each shown every agent's answer of the round before (``{answers}``, or ``{<role>}``, in its prompt). A
verifier scores each answer, v_{t,a} ∈ [0, 1]: here the env's program (``Env.step`` on a copy of the task: 1 when
the answer is right), where MAPoRL trains a verifier model (a ``reward`` model can stand in for it). The real task
never changes; the episode lasts T rounds and succeeds when a majority of the last round's answers are right.

Rewards, written once the episode is over (``settle``), with γ = ``workflow.gamma`` and T' the last round:

    R_{t,a} = [ v_{t,a} + Σ_{t'=t+1}^{T'} γ^{t'−t} · mean_{a'} v_{t',a'} ] / Σ_{t'=t}^{T'} γ^{t'−t}

(MAPoRL's "influence-aware verification reward", ``score_rule`` with ``discounted_sum`` over ``all`` agents: a turn
is paid for its own answer and for how right the whole team is afterwards), plus the incentive bonus (MAPoRL's
``bonus_rule``, thresholds ½), with o_t the mean of the *other* agents' v at round t and "right" meaning > ½:

    revision (t > 0): wrong → right: + w_persuaded if o_{t−1} was right (it was persuaded), + w_own if not;
                      right → wrong: − w_persuaded if o_{t−1} was wrong (persuaded wrongly), − w_own if not;
    influence (t < T'): the others wrong at t and right at t+1: + w_lead if a was right at t (it led them),
                      + w_follow if not; the others right at t and wrong at t+1: the same amounts, negative.

The released ``bonus_rule`` subtracts the influence amounts when the others turn right and adds them when they turn
wrong — the opposite of what the paper says it rewards (leading others to the right answer); marl follows the
paper. All four weights default to 0 (the code's default); each row keeps ``verdict`` (v), ``verification`` (R)
and ``incentive`` (the bonus) in its info.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig, bounded
from marl_cli.core.samples import Sample
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

RIGHT, WRONG = 0.5, 0.5
"""MAPoRL's thresholds: a score above ``RIGHT`` is right, below ``WRONG`` wrong."""


@dataclass
class DebateConfig(WorkflowConfig):
    """MAPoRL's debate (``workflow=debate``): the agents, rounds and incentive weights."""

    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # γ of the influence-aware verification reward
    w_persuaded: float = 0.0  # α0: revising to the right (+) or wrong (−) answer after others held it
    w_own: float = 0.0  # α1: revising to the right (+) or wrong (−) answer on its own
    w_follow: float = 0.0  # α2: the others turning right (+) or wrong (−) next round while this agent was wrong
    w_lead: float = 0.0  # α3: the others turning right (+) or wrong (−) next round while this agent was right


def verification_rewards(v: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    """R_{t,a} for every round t and agent a from the verdicts ``v[t][a]`` (the module's formula)."""
    rounds = len(v)
    out = []
    for t in range(rounds):
        norm = sum(gamma ** (k - t) for k in range(t, rounds))
        out.append([(v[t][a] + sum(gamma ** (k - t) * sum(v[k]) / len(v[k]) for k in range(t + 1, rounds))) / norm
                    for a in range(len(v[t]))])
    return out


def incentives(v: Sequence[Sequence[float]], weights: Sequence[float]) -> list[list[float]]:
    """The bonus of every round t and agent a (the module's rules); ``weights`` = (w_persuaded, w_own, w_follow,
    w_lead)."""
    persuaded, own, follow, lead = weights
    rounds, agents = len(v), len(v[0])

    def others(t: int, a: int) -> float:
        return sum(v[t][b] for b in range(agents) if b != a) / (agents - 1)

    out = []
    for t in range(rounds):
        row = []
        for a in range(agents):
            bonus = 0.0
            if t > 0:
                before, now = v[t - 1][a], v[t][a]
                crowd = others(t - 1, a) if agents > 1 else None
                if before < WRONG and now > RIGHT:
                    bonus += persuaded if crowd is not None and crowd > RIGHT else own
                elif before > RIGHT and now < WRONG:
                    bonus -= persuaded if crowd is not None and crowd < WRONG else own
            if t < rounds - 1 and agents > 1:
                step = lead if v[t][a] > RIGHT else follow if v[t][a] < WRONG else 0.0
                if others(t, a) < WRONG and others(t + 1, a) > RIGHT:
                    bonus += step
                elif others(t, a) > RIGHT and others(t + 1, a) < WRONG:
                    bonus -= step
            row.append(bonus)
        out.append(row)
    return out


@WORKFLOWS.register("debate", schema=DebateConfig)
class DebateWorkflow(Workflow):
    """N agents answer in parallel each round, shown the others' last answers; the verifier scores every answer."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if len(self.roles) < 2:
            raise ConfigError(f"workflow=debate needs at least two agents in workflow.roles, got {self.roles}")

    def stages(self, turn: int) -> list[list[str]]:
        return [list(self.roles)]

    def prompt(self, role: str, state: TeamState) -> str:
        """The template with ``{answers}``: every agent's last answer (``none`` before the first round)."""
        answers = "; ".join(f"{r}: {state.notes.get(r, 'none')}" for r in self.roles)
        return self.render(role, state, {"answers": answers})

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        answer = self.parse(text)
        t = self.env.step(state.env, answer)  # a copy: the question stays as it is for every agent and round
        verdict = 1.0 if t.success else 0.0
        notes = {**state.notes, role: answer or "none", f"verdict:{role}": str(verdict)}
        new = replace(state, notes=notes)
        if role == self.roles[-1]:  # the round is over
            rounds = int(state.notes.get("rounds", "0")) + 1
            right = sum(float(notes.get(f"verdict:{r}", "0")) for r in self.roles)
            new = replace(new, notes={**notes, "rounds": str(rounds)}, done=rounds >= self.max_turns,
                          success=rounds >= self.max_turns and right > len(self.roles) / 2)
        return Outcome(new, verdict, verdict, 0.0, t.format_ok, {**t.info, "verdict": verdict}, t.success)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """Every row's reward from the episode's verdicts: verification reward plus incentive bonus."""
        by = {(row.turn, row.role): row for row in rows}
        rounds = max((row.turn for row in rows), default=-1) + 1
        v = [[by[t, r].info["verdict"] if (t, r) in by else 0.0 for r in self.roles] for t in range(rounds)]
        cfg = self.cfg
        paid = verification_rewards(v, cfg.gamma)
        bonus = incentives(v, (cfg.w_persuaded, cfg.w_own, cfg.w_follow, cfg.w_lead))
        for (t, role), row in by.items():
            a = self.roles.index(role)
            row.info.update(verification=paid[t][a], incentive=bonus[t][a])
            row.reward = paid[t][a] + bonus[t][a]

    def demonstration(self, role: str, state: TeamState) -> str | None:
        answer = self.env.oracle(state.env)
        return None if answer is None else self.format_answer(answer)
