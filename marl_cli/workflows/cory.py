"""CORY (arXiv 2410.06101, "Coevolving with the Other You"): a pioneer answers, then an observer that sees it.

One LLM is duplicated into two agents (``policy=per_role``). Each turn:

1. the ``pioneer`` answers the task from the real state; its answer is scored on a *copy* of the state (as a
   tool agent's is): the real environment never changes, the pioneer's own env reward and whether it solved
   the task are recorded, and its answer becomes its note, ``{pioneer}`` in the observer's prompt;
2. the ``observer`` answers from the same state, shown the task and the pioneer's answer; its answer is
   applied to the real environment, so the episode's success (and its end) is the observer's.

Rewards. Each agent's own reward is the usual ``α · team + local``: ``local`` is the env's reward for its
answer (the pioneer's on the copy), ``team`` the env's score of the state the answer leads to (the pioneer's:
the copy's). With ``workflow.collective`` (CORY) every row's reward is, once the episode is over (``settle``),
the collective reward of its turn::

    R_t = own_pioneer,t + own_observer,t        (both rows of turn t get R_t)

and each row keeps its own reward in ``info["own"]`` (its partner's components in ``info["partner_local"]``,
``info["partner_team"]``, so ``rescore`` can recompute it with another ``alpha``). ``collective: false`` is the
ablation: each agent its own reward. ``alpha = 0`` gives the paper's sum of the two task rewards; the default
``alpha = 1`` is the other workflows' (the toy table compares them at one alpha).

Several turns (``max_turns > 1``; the paper has one): the pioneer of turn t+1 answers from the state the
observer's answer of turn t left (its prompt may show that answer as ``{observer}``), and only the observer's
answers use up the env's ``actions_per_episode``. The collective reward pairs the two answers of *one* turn,
not the episode: GRPO groups rows by (task, turn, role) across the K branches, so a turn's pair is credited
to that turn, as every other workflow's per-turn reward is. Rewards stay per row (``trajectory_rewards`` is
False): ``settle`` writes them before the algorithm computes advantages, so it trains with ``algorithm=grpo`` or
``at_grpo`` in independent mode. Tree mode is refused: there the pioneer's unchosen candidates get no observer
answer. Swapping the two policies' roles every N steps is the training loop's (``trainer.swap_roles_every``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig
from marl_cli.core.samples import Sample
from marl_cli.envs.base import Transition
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

PARTNER = {"pioneer": "observer", "observer": "pioneer"}
"""Each role's partner, whose reward of the same turn joins its own in the collective reward."""


@dataclass
class CoryConfig(WorkflowConfig):
    """CORY's pioneer and observer (``workflow=cory``)."""

    # true (CORY): every row's reward is its turn's collective reward, the pioneer's own plus the observer's;
    # false (the ablation): each agent's own reward alone
    collective: bool = True


def check_cory(cfg: Any) -> None:
    """CORY pairs every pioneer answer with the observer's answer to it, which tree rollouts do not."""
    if cfg.algorithm.mode == "tree":
        raise ConfigError("workflow=cory needs algorithm.mode=independent: in tree mode the pioneer's unchosen "
                          "candidates get no observer answer, so they have no collective reward")


@WORKFLOWS.register("cory", schema=CoryConfig, check=check_cory)
class CoryWorkflow(Workflow):
    """``pioneer`` (scored on a copy) then ``observer`` (sees the pioneer's answer, moves the real environment)."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if self.roles != list(PARTNER):
            raise ConfigError(f"workflow=cory has the roles [pioneer, observer] in that order, got {self.roles}")
        self.collective: bool = cfg.collective

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        return self.act_many(role, [(state, text)])[0]

    def act_many(self, role: str, jobs: list[tuple[TeamState, str]]) -> list[Outcome]:
        answers = [self.parse(text) for _, text in jobs]
        steps = self.steps([(state.env, answer) for (state, _), answer in zip(jobs, answers, strict=True)])
        score = self._pioneer if role == "pioneer" else self._observer
        return [score(state, answer, t) for (state, _), answer, t in zip(jobs, answers, steps, strict=True)]

    def steps(self, pairs: list[tuple[Any, str | None]]) -> list[Transition]:
        """``env.step`` of every (env state, answer) pair; one sandbox batch where the env runs programs (code)."""
        many = getattr(self.env, "step_many", None)
        return many(pairs) if many is not None else [self.env.step(state, answer) for state, answer in pairs]

    def _pioneer(self, state: TeamState, answer: str | None, t: Transition) -> Outcome:
        return self.outcome(state.with_note("pioneer", answer or "none"), t.reward, t.format_ok, t.info,
                            team=self.env.score(t.state), solved=t.success)

    def _observer(self, state: TeamState, answer: str | None, t: Transition) -> Outcome:
        new = replace(state, env=t.state, done=t.done, success=t.success).with_note("observer", answer or "none")
        return self.outcome(new, t.reward, t.format_ok, t.info)

    def settle(self, state: TeamState, rows: list[Sample]) -> None:
        """Record in every row its partner's reward components of the same turn, then score it (``rescore``)."""
        by_turn = {(row.turn, row.role): row for row in rows}
        for row in rows:
            partner = by_turn.get((row.turn, PARTNER[row.role]))
            if partner is not None:
                row.info.update(partner_local=partner.info["local"], partner_team=partner.info["team"])
        self.rescore(rows)

    def rescore(self, rows: list[Sample]) -> None:
        """Every row's reward from its recorded components: its own ``α · team + local`` (kept in ``info["own"]``),
        plus, when ``collective``, its partner's of the same turn."""
        for row in rows:
            info = row.info
            own = self.alpha * info["team"] + info["local"]
            partner = self.alpha * info.get("partner_team", 0.0) + info.get("partner_local", 0.0)
            info["own"] = own
            row.reward = own + partner if self.collective else own

    def demonstration(self, role: str, state: TeamState) -> str | None:
        answer = self.env.oracle(state.env)
        return None if answer is None else self.format_answer(answer)
