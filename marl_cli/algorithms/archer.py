"""ArCHer's high-level credit (Zhou et al. 2024, "ArCHer: Training Language Model Agents via Hierarchical
Multi-Turn RL", arXiv 2402.19446): an off-policy utterance-level critic (``critic=utterance``: two Q heads and two
V heads, target copies, a replay buffer; trained by the loop, ``critics.phase``) gives each turn the
advantage of its utterance in the state it was said in,

    A = min(Q1, Q2)(s, a) − min(V1, V2)(s)

and the token-level policy is trained with it, the same value on each of the turn's tokens, through TRL's clipped
loss. The critic's targets are TD targets across a role's turns, Q_i(s, a) ← r + γ·V̄_i(s′) and V_i(s) ← Q̄_i(s, a)
(``algorithms/td.py``).

Its critic (``ARCHER_VALUES``): four heads (V1, V2, Q1, Q2) and a target copy; the step's turns join a replay buffer
as transitions (s, a, r, s′ = the role's next prompt in its episode, done after its last turn); each of
``critic.updates_per_step`` updates draws ``critic.replay_batch_size`` of them and regresses
Q_i(s, a) → r + γ·(1 − done)·V̄_i(s′) and V_i(s) → Q̄_i(s, a) (plain MSE), then moves the target copy by τ. ArCHer's
code takes the V target at a fresh action of the current policy; marl takes the stored action, which needs no
generation in the critic's update (V then tracks the value of the actions the buffer holds).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.gae import role_keys, turn_order
from marl_cli.algorithms.marft import utterance_values
from marl_cli.algorithms.td import critic_targets
from marl_cli.algorithms.values import CriticBatch, Regression, Transition, ValueLearning
from marl_cli.config.schema import AlgorithmConfig, bounded
from marl_cli.core.samples import Sample


@dataclass
class ArcherConfig(AlgorithmConfig):
    """ArCHer's critic targets: TD across a role's turns."""

    gamma: float = bounded(0.95, ge=0.0, le=1.0)  # the discount per TD step (from a role's turn to its next)


def archer_estimator(samples: list[Sample], cfg: Any, rng: random.Random,
                     rollouts: dict[int, list[int]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Each row's ``advantage`` = its critic Q minus its critic V (both the minimum of the two heads)."""
    values = utterance_values(samples, "archer")
    for s, v in zip(samples, values, strict=True):
        if s.estimates.get("q_value") is None:
            raise ValueError(f"row (task {s.task}, turn {s.turn}, role {s.role}) has no critic Q value: "
                             "algorithm=archer reads critic=utterance")
        s.advantage = s.estimates["q_value"] - v
    n = max(len(samples), 1)
    return samples, {"value_mean": sum(values) / n, "q_mean": sum(s.estimates["q_value"] for s in samples) / n}


V1, V2, Q1, Q2 = range(4)
"""ArCHer's heads of the utterance critic."""


def annotate(critic: Any, rows: list[Sample]) -> None:
    """Each row's ``estimates["value"]`` and ``["q_value"]``: the minimum of the two V heads and of the two Q heads,
    as the actor reads them."""
    import torch

    states, actions = critic.values_at(rows, ["state", "action"])  # one read of the rows
    low_v, low_q = torch.minimum(states[:, V1], states[:, V2]), torch.minimum(actions[:, Q1], actions[:, Q2])
    for s, v, q in zip(rows, low_v.tolist(), low_q.tolist(), strict=True):
        s.estimates.update(value=v, q_value=q)


def update(critic: Any, replay: Any, rows: list[Sample], cfg: Any, step: int,
           rng: random.Random) -> dict[str, float]:
    """The step's turns into the replay buffer, then ``critic.updates_per_step`` TD updates on draws from it (the
    module's docstring); the buffer's size and the age of what the updates drew."""
    replay.add(transitions(rows, step))
    stats: dict[str, list[float]] = defaultdict(list)
    drawn: list[Transition] = []
    for _ in range(cfg.critic.updates_per_step):
        batch = replay.sample(cfg.critic.replay_batch_size, rng)
        drawn += batch
        for key, value in critic.update(td_batch(critic, batch, cfg.algorithm.gamma), rng).items():
            stats[key].append(value)
        critic.soft_update()
    out = {key: sum(values) / len(values) for key, values in stats.items()}
    out.update({f"replay/{key}": value for key, value in replay.ages(step, drawn).items()})
    out["replay/size"] = float(len(replay))
    out["replay/off_policy_fraction"] = sum(t.step < step for t in drawn) / max(len(drawn), 1)
    return out


def td_batch(critic: Any, batch: list[Transition], gamma: float) -> CriticBatch:
    """The regression of the four heads on ``batch``, its targets from the target copy."""
    import torch

    rewards = torch.tensor([t.reward for t in batch], dtype=torch.float64)
    dones = torch.tensor([t.done for t in batch])
    following, here = (v.double() for v in critic.td_values(batch, target=True))  # one read of the target copy
    targets = critic_targets(rewards, dones, (following[:, V1], following[:, V2]), (here[:, Q1], here[:, Q2]), gamma)
    return CriticBatch(batch, [Regression("action", torch.stack([targets.q1, targets.q2], 1), heads=(Q1, Q2)),
                               Regression("state", torch.stack([targets.v1, targets.v2], 1), heads=(V1, V2))])


def transitions(rows: list[Sample], step: int) -> list[Transition]:
    """Each row as a transition: its prompt and completion, its reward, and the prompt of its role's next turn in
    the episode (``turn_order``), or done after its last turn (the episode ended, or hit its turn limit)."""
    following = turn_order(role_keys(rows)).tolist()
    return [Transition(list(s.prompt_ids), list(s.completion_ids), s.reward, j < 0,
                       None if j < 0 else list(rows[j].prompt_ids), step, s.role)
            for s, j in zip(rows, following, strict=True)]


ARCHER_VALUES = ValueLearning("utterance", annotate, update, heads=4, target_copy=True, replay=True, value_clip=False,
                              settings=("tau", "replay_capacity", "replay_batch_size", "updates_per_step"))
"""ArCHer's off-policy utterance critic."""

ALGORITHMS.register("archer", schema=ArcherConfig)(Algorithm(archer_estimator, values=ARCHER_VALUES))
