"""GRPO advantages: normalise each reward within its group.

    A_i = (r_i − mean_g) / (std_g + ε)      (norm_by_std=True; std is the unbiased sample std)
    A_i =  r_i − mean_g                     (norm_by_std=False, the Dr. GRPO form)

A group of one has no baseline and gets A = 0. The group of a sample row is (task, turn, role):
for single-agent GRPO that is just the task. AT-GRPO uses this same normalisation on the rows of
tree rollouts, where a group is the K candidates one agent sampled from one shared state.

Turn credit (``algorithm.turn_credit``, independent rollouts): ``immediate`` normalises each turn's own reward r_t
(the papers' rule); ``return`` normalises the role's discounted return-to-go in its episode,

    G_t = r_t + γ·G_{t+1}      (G after the role's last turn = 0; γ = ``algorithm.gamma``)

so a turn is credited with what follows from it; an episode that ends early simply has fewer terms.
``algorithm.norm_group=episode`` normalises among every turn of the task's K episodes of one role, (task, role),
instead of among the rows of one turn index, (task, turn, role). When the policy decides when an episode ends the
rows at turn t > 0 are only the episodes that lasted that long, so a per-turn-index baseline is the survivors'
(verl #7244); the episode group compares every turn with one baseline.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import AlgorithmConfig, bounded, choices
from marl_cli.core.samples import Sample

GroupFilter = choices("GroupFilter", "none", "zero_std", module=__name__)
TurnCredit = choices("TurnCredit", "immediate", "return", module=__name__)
NormGroup = choices("NormGroup", "turn", "episode", module=__name__)
Selection = choices("Selection", "greedy", "random", module=__name__)


@dataclass
class GroupConfig(AlgorithmConfig):
    """The group normalisation of the GRPO family (grpo, at_grpo, m_grpo)."""

    norm_by_std: bool = True  # False gives the Dr. GRPO form r − mean
    std_eps: float = bounded(1e-6, ge=0.0)  # ε in (r − mean) / (std + ε); 1e-4 gives TRL's advantages
    filter: GroupFilter = GroupFilter.none  # zero_std drops groups whose rewards are all equal


@dataclass
class GRPOConfig(GroupConfig):
    """GRPO's turn credit: which reward of a role's turn is normalised, and among which rows."""

    # the reward a row's advantage normalises: immediate (its turn's own) | return (its role's discounted
    # return-to-go in its episode: G_t = r_t + gamma * G_{t+1} over the role's later turns)
    turn_credit: TurnCredit = TurnCredit.immediate
    gamma: float = bounded(1.0, ge=0.0, le=1.0)  # turn_credit=return: the discount per turn of the role
    # the rows a reward is normalised among: turn (same task, turn and role: AT-GRPO's) | episode (same task and
    # role, every turn; unbiased when the policy decides when an episode ends)
    norm_group: NormGroup = NormGroup.turn
    # roles whose rows share one baseline across the step's tasks, (turn, role): a role that acts once per task (a
    # proposer: one row a task) has no group of its own (task-relative REINFORCE++, SSP's proposer)
    batch_roles: list[str] = field(default_factory=list)


@dataclass
class ATGRPOConfig(GRPOConfig):
    """AT-GRPO: GRPO's settings, and tree rollouts (``mode=tree``) with the candidate that advances the state."""

    selection: Selection = Selection.greedy  # tree mode: which candidate advances the state (best reward)


def group_advantages(rewards: Sequence[float], groups: Sequence[Hashable], norm_by_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """The advantage of every reward given the group it belongs to."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    advantages = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        values = [rewards[i] for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in idx:
            centred = rewards[i] - mean
            advantages[i] = centred / (std + eps) if norm_by_std else centred
    return advantages


def group_key(sample: Sample) -> tuple[int, int, str]:
    """Samples compete only with samples of the same task, turn and role."""
    return (sample.task, sample.turn, sample.role)


def batch_group_key(sample: Sample) -> tuple[int, int, str]:
    """``batch_roles``: samples compete with the same role's at the same turn of every task (task -1 stands for
    all)."""
    return (-1, sample.turn, sample.role)


def episode_group_key(sample: Sample) -> tuple[int, int, str]:
    """``norm_group=episode``: samples compete with every turn of the same task and role (turn -1 stands for all)."""
    return (sample.task, -1, sample.role)


def role_episodes(samples: Sequence[Sample]) -> list[list[int]]:
    """The indices of each role's rows in each episode (task, branch, role, segment), in turn order."""
    episodes: dict[Hashable, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        episodes[(s.task, s.branch, s.role, s.segment)].append(i)
    return [sorted(idx, key=lambda i: samples[i].turn) for idx in episodes.values()]


def turn_returns(samples: Sequence[Sample], gamma: float, values: Sequence[float] | None = None) -> list[float]:
    """Each row's discounted return-to-go G_t = r_t + γ·G_{t+1} over the later turns of its role in its episode
    (``role_episodes``); ``values`` (one per row) in place of the rewards r."""
    values = [s.reward for s in samples] if values is None else values
    returns = [0.0] * len(samples)
    for idx in role_episodes(samples):
        ahead = 0.0
        for i in reversed(idx):
            ahead = values[i] + gamma * ahead
            returns[i] = ahead
    return returns


def assign_advantages(samples: list[Sample], norm_by_std: bool = True, eps: float = 1e-6, filter: str = "none",
                      values: Sequence[float] | None = None, by_turn: bool = True,
                      batch_roles: Sequence[str] = ()) -> dict[str, float]:
    """Fill in ``advantage`` (and ``keep`` under ``filter="zero_std"``) for every row from ``values`` (one per row:
    what is normalised; default its reward), grouped per (task, turn, role), or per (task, role) unless ``by_turn``,
    and the rows of ``batch_roles`` per (turn, role) across tasks; return group statistics."""
    keys = [batch_group_key(s) if s.role in batch_roles else group_key(s) if by_turn else episode_group_key(s)
            for s in samples]
    values = [s.reward for s in samples] if values is None else list(values)
    for s, a in zip(samples, group_advantages(values, keys, norm_by_std, eps), strict=True):
        s.advantage = a
    rewards_by_group: dict[Hashable, list[float]] = defaultdict(list)
    for v, k in zip(values, keys, strict=True):
        rewards_by_group[k].append(v)
    zero_std = {k for k, rs in rewards_by_group.items() if max(rs) - min(rs) == 0}
    if filter == "zero_std":
        for s, k in zip(samples, keys, strict=True):
            s.keep = k not in zero_std
    stats = {"groups": float(len(rewards_by_group)),
             "zero_std_fraction": len(zero_std) / max(len(rewards_by_group), 1)}
    for role in sorted({k[2] for k in rewards_by_group}):
        mine = [k for k in rewards_by_group if k[2] == role]
        stats[f"{role}/zero_std_fraction"] = sum(k in zero_std for k in mine) / len(mine)
    stats.update(by_turn_index(samples))
    return stats


def by_turn_index(samples: Sequence[Sample]) -> dict[str, float]:
    """The rows and their mean advantage at each turn index (``turn<t>/...``): per-turn groups centre each turn's
    advantages on its own rows; an episode group shows which turns it credits above the task's baseline."""
    turns: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        turns[s.turn].append(s.advantage)
    out: dict[str, float] = {}
    if len(turns) < 2:
        return out
    for t, values in sorted(turns.items()):
        out[f"turn{t}/rows"] = float(len(values))
        out[f"turn{t}/advantage_mean"] = sum(values) / len(values)
    return out


def grpo_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                   rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """GRPO and AT-GRPO: the rows themselves, each one's reward (or return: ``turn_credit``) normalised within its
    group (``norm_group``)."""
    returns = cfg.turn_credit == "return"
    values = turn_returns(samples, cfg.gamma) if returns else None
    stats = assign_advantages(samples, cfg.norm_by_std, cfg.std_eps, cfg.filter, values, cfg.norm_group == "turn",
                              cfg.batch_roles)
    if returns:
        stats["return_mean"] = sum(values) / max(len(values), 1)
    return samples, stats


def check_turn_credit(cfg: Any) -> None:
    """Returns and episode groups follow a role through one episode: independent rollouts only."""
    algorithm = cfg.algorithm
    if algorithm.gamma != 1.0 and algorithm.turn_credit != "return":
        raise ConfigError(f"algorithm.gamma={algorithm.gamma} discounts returns only: set algorithm.turn_credit=return")
    changed = [f"{key}={algorithm[key]}" for key, plain in (("turn_credit", "immediate"), ("norm_group", "turn"))
               if algorithm[key] != plain]
    if changed and algorithm.mode == "tree":
        raise ConfigError(f"algorithm.{changed[0]} follows a role through one episode; tree rollouts branch at every "
                          "turn (a group is one state's K candidates): use algorithm.mode=independent")


AT_GRPO_REGIMES = {"shared": "AT-GRPO, shared policy", "per_role": "AT-GRPO, per-role policies",
                   "lora_per_role": "AT-GRPO, LoRA per role"}
"""AT-GRPO's rows in the paper's tables, by policy regime."""


def grpo_label(key: Callable[[str], Any], single: bool) -> str:
    return "single agent + GRPO" if single else "MAS + GRPO"


def at_grpo_label(key: Callable[[str], Any], single: bool) -> str:
    policy = str(key("policy.name"))
    return AT_GRPO_REGIMES.get(policy, f"AT-GRPO, {policy}")


ALGORITHMS.register("grpo", schema=GRPOConfig, check=check_turn_credit)(Algorithm(grpo_estimator, label=grpo_label))
ALGORITHMS.register("at_grpo", schema=ATGRPOConfig, check=check_turn_credit)(
    Algorithm(grpo_estimator, modes=("independent", "tree"), label=at_grpo_label))
