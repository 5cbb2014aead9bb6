"""Running episodes for a batch of tasks: one batched generate call per policy per role turn.

Every task gets ``branches`` independent episodes. In each turn the workflow's roles act in order;
for each role, the prompts of all live episodes are generated together by the role's policy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from marl_cli.policies.regime import Policy
from marl_cli.rollout.generation import HFGenerator, Sampling
from marl_cli.rollout.samples import Sample
from marl_cli.workflows.base import Workflow


@dataclass
class Episode:
    """One branch of one task."""

    task: int
    branch: int
    state: Any
    done: bool = False
    success: bool = False
    turns: int = 0
    team_return: float = 0.0


@dataclass
class RolloutResult:
    """The sample rows of a batch of episodes and the episodes themselves."""

    samples: list[Sample]
    episodes: list[Episode]
    generate_calls: int


def run_episodes(workflow: Workflow, policies: dict[str, Policy], role_map: dict[str, str],
                 tasks: list[Any], branches: int, sampling: Sampling, generator: HFGenerator) -> RolloutResult:
    """Play ``branches`` episodes of every task; return every agent completion as a sample row."""
    env = workflow.env
    episodes = [Episode(t, b, env.initial_state(task)) for t, task in enumerate(tasks) for b in range(branches)]
    samples: list[Sample] = []
    calls_before = generator.calls
    for turn in range(workflow.max_turns):
        for role in workflow.turn_order(turn):
            live = [ep for ep in episodes if not ep.done]
            if not live:
                break
            policy = policies[role_map[role]]
            prompts = [workflow.prompt(role, ep.state) for ep in live]
            for ep, gen in zip(live, generator.generate(policy, prompts, sampling), strict=True):
                transition, reward = workflow.act(role, ep.state, gen.text)
                samples.append(Sample(task=ep.task, branch=ep.branch, turn=turn, role=role, policy=policy.name,
                                      prompt_ids=gen.prompt_ids, completion_ids=gen.completion_ids,
                                      reward=reward, success=transition.success,
                                      format_ok=transition.format_ok, info=dict(transition.info)))
                ep.state, ep.done, ep.success = transition.state, transition.done, transition.success
                ep.team_return += transition.reward
                ep.turns = turn + 1
        if all(ep.done for ep in episodes):
            break
    return RolloutResult(samples, episodes, generator.calls - calls_before)


def rollout_metrics(result: RolloutResult, prefix: str) -> dict[str, float]:
    """Per-agent reward, success and format-failure rate, plus episode-level success and turns."""
    metrics: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in result.samples:
        by_role[s.role].append(s)
    for role, rows in by_role.items():
        metrics[f"{prefix}/{role}/reward"] = sum(s.reward for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/format_failure"] = sum(not s.format_ok for s in rows) / len(rows)
        metrics[f"{prefix}/{role}/completion_tokens"] = sum(len(s.completion_ids) for s in rows) / len(rows)
    eps = result.episodes
    metrics[f"{prefix}/success"] = sum(ep.success for ep in eps) / len(eps)
    metrics[f"{prefix}/turns"] = sum(ep.turns for ep in eps) / len(eps)
    metrics[f"{prefix}/return"] = sum(ep.team_return for ep in eps) / len(eps)
    metrics[f"{prefix}/generate_calls"] = float(result.generate_calls)
    return metrics
