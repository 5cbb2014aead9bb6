"""Running episodes for a batch of tasks, independent or as AT-GRPO trees.

``independent``: every task gets K episodes (branches), each agent answers once per turn.
``tree``: every task gets one episode; at each turn each agent samples K candidates from the same
state, each candidate is scored on a copy (the workflow's ``act`` never mutates), every candidate
becomes a sample row, and the selected one (greedy: best reward, ties broken at random; or random)
advances the shared state for the next agent.

Who acts is the workflow's call: in each stage only the roles for which ``workflow.acting`` holds
act in an episode (a main agent waits while its sub-agent works). Rewards known only at the end
of an episode (M-GRPO's) are written into its rows by ``workflow.settle`` once it is over.

Batching: in each stage of a turn, the prompts of all live episodes × candidates × roles that act
through the same policy go to that policy in one generate call (more only when they exceed the
rollout batch size). Calls per stage therefore equal the number of policies acting in it,
whatever the number of tasks. A scripted role (routed to ``scripted:<actor>``, ``policies/scripted.py``)
answers through its actor instead, with no generate call and rows without token ids.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import Policy
from marl_cli.policies.scripted import is_scripted, scripted_actor
from marl_cli.rollout.backends.base import Generator
from marl_cli.rollout.generation import Generation, Sampling
from marl_cli.workflows.base import Outcome, TeamState, Workflow

MODES = ("independent", "tree")
SELECTIONS = ("greedy", "random")


@dataclass
class Episode:
    """One episode of one task (one branch of it in independent mode)."""

    task: int
    branch: int
    state: TeamState
    turns: int = 0
    team_return: float = 0.0

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def success(self) -> bool:
        return self.state.success


@dataclass
class RolloutResult:
    """The sample rows of a batch of episodes, the episodes, and generate calls (in all and per turn)."""

    samples: list[Sample]
    episodes: list[Episode]
    generate_calls: int
    calls_per_turn: list[int] = field(default_factory=list)


def select(outcomes: list[Outcome], selection: str, rng: random.Random) -> int:
    """The index of the candidate that advances the state."""
    if selection == "random":
        return rng.randrange(len(outcomes))
    best = max(o.reward for o in outcomes)
    return rng.choice([i for i, o in enumerate(outcomes) if o.reward == best])


@dataclass
class Rollout:
    """What a run plays episodes with, built once (``training/build.py::build_run``): the team (workflow over its
    env), the policies and which one acts for each role now (``routing``), the generation backend, the sampling
    settings (the learner's loss temperature reads the same ``sampling``), and the rollout mode and tree selection.

    ``play(tasks, k, rng)`` plays a training rollout; ``evaluation()`` is this rollout with the evaluation
    sampling, one independent episode per sample. With ``references`` each row also records its role's correct
    answer in the state its turn starts in (``Workflow.demonstration``: the env's oracle in the role's format).
    """

    workflow: Workflow
    policies: dict[str, Policy]
    routing: dict[str, str]
    generator: Generator
    sampling: Sampling
    eval_sampling: Sampling | None = None
    mode: str = "independent"
    selection: str = "greedy"
    references: bool = False  # record on each row its role's correct answer where its turn starts (IGPO scores it)
    evaluating: bool = False  # an evaluation: the workflow's train-only roles do not act

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"algorithm.mode={self.mode!r} is unknown; choose from: {', '.join(MODES)}")
        if self.selection not in SELECTIONS:
            raise ConfigError(f"algorithm.selection={self.selection!r} is unknown; choose from: "
                              f"{', '.join(SELECTIONS)}")

    def evaluation(self) -> Rollout:
        """This rollout with the evaluation sampling (the training sampling when none is set), independent episodes."""
        return replace(self, sampling=self.eval_sampling or self.sampling, mode="independent", evaluating=True)

    def start_generator(self) -> None:
        """Start what the policies acting now need in the backend (every process of a run at once)."""
        self.generator.start([self.policies[name] for name in dict.fromkeys(self.routing.values())
                              if not is_scripted(name)])

    def play(self, tasks: list[Any], k: int, rng: random.Random | None = None) -> RolloutResult:
        """Play every task (``k`` branches, or ``k`` candidates per agent turn in tree mode); return all rows."""
        rng = rng or random.Random(0)
        tree = self.mode == "tree"
        branches, candidates = (1, k) if tree else (k, 1)
        workflow, generator = self.workflow, self.generator
        episodes = [Episode(t, b, workflow.initial_state(task)) for t, task in enumerate(tasks)
                    for b in range(branches)]
        samples: list[Sample] = []
        calls_before = generator.calls
        calls_per_turn: list[int] = []
        for turn in range(workflow.max_turns):
            calls_at_turn = generator.calls
            for stage in workflow.stages(turn):
                stage = [role for role in stage if not (self.evaluating and role in workflow.train_only)]
                live = [ep for ep in episodes if not ep.done]
                if not live:
                    break
                generations = self._generate_stage(stage, live, candidates)
                for role in stage:
                    samples += self._act(role, turn, live, generations[role], candidates, rng)
            calls_per_turn.append(generator.calls - calls_at_turn)
            if all(ep.done for ep in episodes):
                break
        self._settle(samples, episodes)
        return RolloutResult(samples, episodes, generator.calls - calls_before, calls_per_turn)

    def _settle(self, samples: list[Sample], episodes: list[Episode]) -> None:
        """Each episode's end-of-episode rewards (``workflow.settle``), then each task's (``settle_task``)."""
        tree = self.mode == "tree"
        rows: dict[tuple[int, int], list[Sample]] = defaultdict(list)
        for s in samples:
            rows[s.task, 0 if tree else s.branch].append(s)
        for ep in episodes:
            self.workflow.settle(ep.state, rows[ep.task, ep.branch])
        by_task: dict[int, list[Episode]] = defaultdict(list)
        for ep in episodes:
            by_task[ep.task].append(ep)
        for task, eps in by_task.items():
            self.workflow.settle_task([ep.state for ep in eps], [s for ep in eps for s in rows[task, ep.branch]])

    def _act(self, role: str, turn: int, live: list[Episode], generations: dict[tuple[int, int], list[Generation]],
             candidates: int, rng: random.Random) -> list[Sample]:
        """Score ``role``'s candidates in every episode where it acted, advance each episode with the selected one
        (tree) or its only one; the candidates' sample rows."""
        workflow, tree = self.workflow, self.mode == "tree"
        acting = [ep for ep in live if not ep.done and (ep.task, ep.branch) in generations]
        followers = self._followers(role, live, acting)
        jobs = [(ep.state, g.text) for ep in acting for g in generations[ep.task, ep.branch]]
        segments = [workflow.segment(role, ep.state) for ep in acting]
        references = [workflow.demonstration(role, ep.state) if self.references else None for ep in acting]
        outcomes = workflow.act_many(role, jobs)
        temperature = self.sampling.for_role(role).temperature
        samples: list[Sample] = []
        for i, ep in enumerate(acting):
            gens = generations[ep.task, ep.branch]
            mine = outcomes[i * candidates:(i + 1) * candidates]
            for c, (gen, out) in enumerate(zip(gens, mine, strict=True)):
                samples.append(Sample(
                    task=ep.task, branch=c if tree else ep.branch, turn=turn, role=role,
                    policy=self.routing[role], prompt_ids=gen.prompt_ids, completion_ids=gen.completion_ids,
                    reward=out.reward, success=out.solved, format_ok=out.format_ok,
                    info={**out.info, "local": out.local, "team": out.team}, segment=segments[i],
                    sampling_logprobs=gen.logprobs, prompt_truncated=gen.prompt_truncated, finished=gen.finished,
                    temperature=temperature, reference=references[i]))
            chosen = mine[select(mine, self.selection, rng)] if tree else mine[0]
            for each in [ep, *followers.get(ep.task, [])]:
                each.state = chosen.state
                each.team_return += chosen.reward
                each.turns = turn + 1
        return samples

    def _followers(self, role: str, live: list[Episode], acting: list[Episode]) -> dict[int, list[Episode]]:
        """For a role that acts once per task (``workflow.once``): the task's other live episodes, which take the
        state its one action leads to; none for other roles."""
        leaders = {ep.task: ep for ep in acting if self.workflow.once_per_task(role, ep.state)}
        out: dict[int, list[Episode]] = defaultdict(list)
        for ep in live:
            if ep.task in leaders and ep is not leaders[ep.task]:
                out[ep.task].append(ep)
        return out

    def _generate_stage(self, stage: list[str], live: list[Episode],
                        candidates: int) -> dict[str, dict[tuple[int, int], list[Generation]]]:
        """Generate for every role of the stage that is acting, one batched call per policy (per policy and role
        sampling when roles of one policy sample differently or have different system messages), a scripted role's
        answers from its actor (no call, no token ids); results by role and episode."""
        workflow, sampling = self.workflow, self.sampling
        by_policy: dict[tuple[str, str], list[tuple[str, Episode]]] = defaultdict(list)
        out: dict[str, dict[tuple[int, int], list[Generation]]] = {role: defaultdict(list) for role in stage}
        for role in stage:  # roles of one policy share a call unless they sample differently
            actor = scripted_actor(self.routing[role])
            seen: set[int] = set()
            for ep in live:
                if not workflow.acting(role, ep.state) or (workflow.once_per_task(role, ep.state) and ep.task in seen):
                    continue
                seen.add(ep.task)
                if actor is not None:
                    out[role][ep.task, ep.branch] += [Generation([], [], actor(workflow, role, ep.state))
                                                      for _ in range(candidates)]
                else:
                    by_policy[self.routing[role], sampling.key(role)].extend([(role, ep)] * candidates)
        for (name, _), items in by_policy.items():
            prompts = [workflow.prompt(role, ep.state) for role, ep in items]
            gens = self.generator.generate(self.policies[name], prompts, sampling.for_role(items[0][0]))
            for (role, ep), gen in zip(items, gens, strict=True):
                out[role][ep.task, ep.branch].append(gen)
        return out


def row_metrics(samples: list[Sample], prefix: str) -> dict[str, float]:
    """Per-agent reward (and own reward where the team shares one), success, format-failure rate, completion
    length (mean, max), the share of completions that ended with an end token (the rest hit ``max_new_tokens``)
    and truncated prompts."""
    metrics: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    for role, rows in by_role.items():
        metrics[f"{prefix}/{role}/reward"] = sum(s.reward for s in rows) / len(rows)
        if all("own" in s.info for s in rows):  # a reward shared by the team (CORY's): each agent's own beside it
            metrics[f"{prefix}/{role}/own_reward"] = sum(s.info["own"] for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/success"] = sum(s.success for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/format_failure"] = sum(not s.format_ok for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/completion_tokens"] = sum(len(s.completion_ids) for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/completion_tokens_max"] = float(max(len(s.completion_ids) for s in rows))
        metrics[f"{prefix}/{role}/finished"] = sum(s.finished for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/prompts_truncated"] = float(sum(s.prompt_truncated for s in rows))
    return metrics


def rollout_metrics(result: RolloutResult, prefix: str, workflow: Workflow) -> dict[str, float]:
    """Per-agent metrics (``row_metrics``), the workflow's own (``Workflow.step_metrics``), plus episode-level
    success, turns and generate calls."""
    metrics = {**row_metrics(result.samples, prefix), **workflow.step_metrics(result.samples, prefix)}
    eps = result.episodes
    metrics[f"{prefix}/success"] = sum(ep.success for ep in eps) / len(eps)
    metrics[f"{prefix}/turns"] = sum(ep.turns for ep in eps) / len(eps)
    metrics[f"{prefix}/return"] = sum(ep.team_return for ep in eps) / len(eps)
    metrics[f"{prefix}/generate_calls"] = float(result.generate_calls)
    return metrics
