"""Proposer and solver (Search Self-play, arXiv 2510.18821; code Alibaba-Quark/SSP): the team writes its own tasks.

Each training task of the env is a *seed*: the ``proposer`` is shown it as an example and writes a new task of the
family (``{marker} <task>``, in the family's own notation: ``12 - 4`` for ``env=math``). It acts once per
task, before the task's K episodes part (``Workflow.once``), so its one proposal is what all K ``solver`` episodes
solve: the solver's K rows are a group over one question. A program checks the proposal (``Env.parse_task``: it
parses, it can be solved, an answer it states is right — SSP's RAG check, exact here); an invalid one ends the task's
episodes at once, no solver plays, and the proposer is paid ``workflow.invalid_reward``. Rewards:

    solver:   the env's reward for its answer (its program's verdict against the proposal's answer)
    proposer: 1 − s                   (``proposer_reward=one_minus_success``, SSP's "1-acc")
              4·s·(1 − s)             (``intermediate``, SSP's intermediate difficulty with left 0, right 1)
              where s = the share of the task's K solver episodes that solved it

written once the task's episodes are over (``settle_task``). The proposer has one row a task, so it needs a baseline
across tasks: train with ``algorithm.batch_roles=[proposer]`` (SSP trains its proposer with REINFORCE++'s batch
baseline). Evaluations skip the proposer (``Workflow.train_only``): the solver answers the env's held-out tasks,
so held-out accuracy measures the solver on questions nobody in the team wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import WorkflowConfig, choices
from marl_cli.core.samples import Sample
from marl_cli.envs import ENVS
from marl_cli.workflows.base import WORKFLOWS, Outcome, TeamState, Workflow

ProposerReward = choices("ProposerReward", "one_minus_success", "intermediate", module=__name__)
ROLES = ["proposer", "solver"]


@dataclass
class ProposeSolveConfig(WorkflowConfig):
    """A proposer that writes the task and a solver that answers it (``workflow=propose_solve``)."""

    proposer_reward: ProposerReward = ProposerReward.one_minus_success  # 1 − s, or 4·s·(1 − s)
    invalid_reward: float = -1.0  # a proposal the family's program rejects (SSP's format penalty)


def check_self_made(cfg: Any, once: list[str]) -> None:
    """The env writes tasks, rollouts are independent, and the roles of ``once`` (one row a task) have a baseline
    across tasks."""
    name = cfg.workflow.name
    if not ENVS.get(cfg.env.name).writes_tasks:
        writers = sorted(n for n in ENVS.names() if ENVS.get(n).writes_tasks)
        raise ConfigError(f"workflow={name} needs an env whose tasks a model can write; env={cfg.env.name} "
                          f"cannot (choose from: {', '.join(writers)})")
    if cfg.algorithm.mode == "tree":
        raise ConfigError(f"workflow={name} needs algorithm.mode=independent: the solver's K episodes of a "
                          "task share the proposer's one proposal")
    missing = [role for role in once if role not in (cfg.algorithm.get("batch_roles") or [])]
    if missing:
        acts = "acts" if len(missing) == 1 else "act"
        raise ConfigError(f"workflow={name}: the {' and '.join(missing)} {acts} once a task (one row each), so the "
                          f"baseline is across tasks: set algorithm.batch_roles=[{', '.join(once)}] "
                          "(algorithm=grpo or at_grpo)")


def check_propose_solve(cfg: Any) -> None:
    """``check_self_made`` for the proposer."""
    check_self_made(cfg, ["proposer"])


@WORKFLOWS.register("propose_solve", schema=ProposeSolveConfig, check=check_propose_solve)
class ProposeSolveWorkflow(Workflow):
    """``proposer`` (once per task, training only) writes the task; ``solver`` answers it."""

    once = ("proposer",)
    train_only = ("proposer",)
    role_lists: tuple[list[str], ...] = (ROLES,)
    """The roles the workflow accepts, in order."""

    def __init__(self, cfg: Any, env: Any):
        super().__init__(cfg, env)
        if self.roles not in self.role_lists:
            allowed = " or ".join(f"[{', '.join(roles)}]" for roles in self.role_lists)
            raise ConfigError(f"workflow={cfg.name} has the roles {allowed} in that order, got {self.roles}")

    def stages(self, turn: int) -> list[list[str]]:
        """The proposer at the first turn, then the solver (only the solver's later answers fill later turns)."""
        return [["proposer"], ["solver"]] if turn == 0 else [["solver"]]

    def act(self, role: str, state: TeamState, text: str) -> Outcome:
        if role == "proposer":
            return self._propose(state, text)
        new, reward, format_ok, info = self.step_env(state, self.parse(text))
        return self.outcome(new.with_note("solver", self.parse(text) or "none"), reward, format_ok, info)

    def _propose(self, state: TeamState, text: str) -> Outcome:
        """A valid proposal becomes the task every episode of this one plays; an invalid one ends them all."""
        proposal = self.parse(text)
        task = None if proposal is None else self.env.parse_task(proposal)
        if task is None:
            ended = replace(state, done=True).with_note("proposer", proposal or "none")
            return Outcome(ended, self.cfg.invalid_reward, self.cfg.invalid_reward, 0.0, False, {"valid": 0.0})
        new = TeamState(self.env.initial_state(task)).with_note("proposer", proposal)
        return Outcome(new, 0.0, 0.0, 0.0, True, {"valid": 1.0})

    def settle_task(self, finals: list[TeamState], rows: list[Sample]) -> None:
        """The proposer's reward from the share s of the task's episodes the solver solved (valid proposals)."""
        proposals = [row for row in rows if row.role == "proposer" and row.info.get("valid") == 1.0]
        if not proposals:
            return
        s = sum(state.success for state in finals) / len(finals)
        reward = 1.0 - s if self.cfg.proposer_reward == "one_minus_success" else 4.0 * s * (1.0 - s)
        for row in proposals:
            row.reward = reward
            row.info["solve_rate"] = s

    def step_metrics(self, rows: list[Sample], prefix: str) -> dict[str, float]:
        """The share of proposals the program accepted and the mean solve rate of the accepted ones."""
        proposals = [row for row in rows if row.role == "proposer"]
        if not proposals:
            return {}
        valid = [row for row in proposals if row.info.get("valid") == 1.0]
        metrics = {f"{prefix}/proposer/valid": len(valid) / len(proposals)}
        if valid:
            metrics[f"{prefix}/proposer/solve_rate"] = sum(row.info["solve_rate"] for row in valid) / len(valid)
        return metrics

    def demonstration(self, role: str, state: TeamState) -> str | None:
        """The proposer: another task of the family (drawn from the seed's own text, so demonstrations differ from
        their example); the solver: the env's oracle answer."""
        if role == "proposer":
            written = self.env.write_task(self.another_task(state))
            return None if written is None else self.format_answer(written)
        answer = self.env.oracle(state.env)
        return None if answer is None else self.format_answer(answer)
