"""IGPO: information-gain turn rewards (Wang et al., "Information Gain-based Policy Optimization", arXiv 2510.14967;
code GuoqingWang1/IGPO). No critic: the acting policy itself, teacher-forced, says how much a turn helped.

For each row (a role's turn t in one episode) the rollout records the role's correct answer g_t where the turn
starts (``Sample.reference``: the env's oracle in the role's format; for a task with one gold answer, that answer
every turn) and the policy scores it after the turn's prompt x_t, no gradient, at temperature 1:

    P_t = exp( mean_j log π(g_t,j | x_t, g_t,<j) )          (the per-token geometric mean, as IGPO's code)

The turn's reward is what the turn gained and the last turn keeps its outcome (the env's reward):

    r_t = w·(P_{t+1} − P_t)        for every turn but the role's last in the episode
    r_T = the outcome reward        (plus w·0: nothing follows it)

with w = ``credit.gain_weight`` (``credit.keep_turn_rewards`` adds the env's own turn reward to r_t, t < T). The
rewards of every turn of a task's K episodes are normalised together (``algorithm.norm_group=episode``, IGPO's
joint mode) and each turn's advantage is the discounted sum of the normalised rewards from it on,

    A_t = Σ_{k ≥ t} γ^{k−t} Â_k          (γ = ``credit.gamma``)

A row without a reference (a workflow with no oracle for that role) keeps its reward and is counted
(``credit/igpo_unscored``). Each distinct (prompt, reference) is scored once (a task's K episodes share their
first prompt), in batches of ``credit.batch_size``; ``time/credit_s`` is the cost per step.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.grpo import role_episodes, turn_returns
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import CreditConfig, bounded
from marl_cli.core.samples import Sample
from marl_cli.credit.base import CREDITS, Credit


@dataclass
class IgpoConfig(CreditConfig):
    """IGPO (``credit=igpo``): turn rewards from the gain in the policy's probability of the correct answer."""

    gain_weight: float = bounded(1.0, gt=0.0)  # w in r_t = w·(P_{t+1} − P_t)
    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # γ in A_t = Σ_k γ^{k−t} Â_k (IGPO's default 1.0)
    keep_turn_rewards: bool = False  # also pay the env's own reward on turns before the last
    batch_size: int = bounded(32, ge=1)  # rows per teacher-forced scoring pass


def check_igpo(cfg: Any) -> None:
    """IGPO normalises every turn's reward of a task together and sums the normalised ones over later turns."""
    if "norm_group" not in cfg.algorithm:
        raise ConfigError(f"credit=igpo reshapes the turn rewards GRPO normalises: use algorithm=grpo or at_grpo, "
                          f"not {cfg.algorithm.name}")
    if cfg.algorithm.norm_group != "episode" or cfg.algorithm.turn_credit != "immediate":
        raise ConfigError("credit=igpo normalises every turn of a task's episodes together, then sums them over later "
                          "turns: set algorithm.norm_group=episode and keep algorithm.turn_credit=immediate")


def reference_probabilities(policy: Any, rows: list[Sample], batch_size: int) -> list[float]:
    """P = exp(mean log π(reference tokens | prompt)) of each row under ``policy``, teacher-forced, no gradient."""
    from marl_cli.core.scoring import completion_logprobs

    tokenizer = policy.tokenizer
    policy.activate()
    answers = [tokenizer(s.reference, add_special_tokens=False).input_ids for s in rows]
    logps = completion_logprobs(policy.model, [s.prompt_ids for s in rows], answers, tokenizer.pad_token_id,
                                batch_size)
    return [math.exp(sum(lp) / max(len(lp), 1)) for lp in logps]


def score(rows: list[Sample], credit: Any, run: Any) -> dict[int, float]:
    """P of every row that has a reference and a policy, by row index: each distinct (policy, prompt, reference)
    scored once."""
    distinct: dict[tuple[str, tuple[int, ...], str], list[int]] = defaultdict(list)
    for i, s in enumerate(rows):
        if s.reference and s.policy in run.policies:  # an empty answer (no oracle) has nothing to score
            distinct[s.policy, tuple(s.prompt_ids), s.reference].append(i)
    by_policy: dict[str, list[tuple[str, tuple[int, ...], str]]] = defaultdict(list)
    for key in distinct:
        by_policy[key[0]].append(key)
    probability: dict[int, float] = {}
    for name, keys in by_policy.items():
        probes = [rows[distinct[key][0]] for key in keys]
        for key, p in zip(keys, reference_probabilities(run.policies[name], probes, credit.batch_size), strict=True):
            probability.update(dict.fromkeys(distinct[key], p))
    return probability


def information_gain(rows: list[Sample], probability: dict[int, float], credit: Any) -> list[float]:
    """Each scored row's gain P_{t+1} − P_t over its role's next turn in its episode (none after the last turn)."""
    gains: dict[int, float] = {}
    for idx in role_episodes(rows):
        for now, after in itertools.pairwise(idx):
            if now in probability and after in probability:
                gains[now] = probability[after] - probability[now]
    for i, gain in gains.items():
        turn = rows[i].reward if credit.keep_turn_rewards else 0.0
        rows[i].reward = turn + credit.gain_weight * gain
    return list(gains.values())


def igpo_rewards(rows: list[Sample], credit: Any, run: Any) -> dict[str, float]:
    """Turn rewards from information gain; statistics of the gains and of what was scored."""
    probability = score(rows, credit, run)
    gains = information_gain(rows, probability, credit)
    mean = sum(gains) / max(len(gains), 1)
    return {"igpo_gain_mean": mean, "igpo_gain_abs_mean": sum(abs(g) for g in gains) / max(len(gains), 1),
            "igpo_gain_positive_fraction": sum(g > 0 for g in gains) / max(len(gains), 1),
            "igpo_probability_mean": sum(probability.values()) / max(len(probability), 1),
            "igpo_scored": float(len(probability)), "igpo_unscored": float(len(rows) - len(probability))}


def igpo_advantages(rows: list[Sample], credit: Any, run: Any) -> dict[str, float]:
    """A_t = Σ_{k ≥ t} γ^{k−t} Â_k over the role's later turns in its episode."""
    summed = turn_returns(rows, credit.gamma, [s.advantage for s in rows])
    for s, a in zip(rows, summed, strict=True):
        s.advantage = a
    return {}


CREDITS.register("igpo", schema=IgpoConfig, check=check_igpo)(
    Credit(rewards=igpo_rewards, advantages=igpo_advantages, references=True))
