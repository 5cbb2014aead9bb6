"""What a value-based algorithm asks of its learned value model (``critic=token|utterance``).

An algorithm that reads a critic registers a ``ValueLearning`` with its estimator: the level of value it reads, the
heads its model carries, whether it keeps a target copy and a replay buffer, the ``critic.*`` settings it reads, how
the critic's values go on the rows before the estimator runs (``annotate``) and how one RL step trains the critic
(``update``). The loop's critic phase (``critics/phase.py``) builds, runs and saves critics from that declaration
alone, so no module outside an algorithm's file knows which algorithm needs what. The critic itself (its model,
optimiser, target copy, replay buffer, data-parallel regression) is ``marl_cli.critics``; this module holds the
vocabulary an algorithm speaks to it in (``Regression``, ``CriticBatch``, ``Transition``) and the on-policy
regression PPO and MARFT share:

    V(s) → R (this step's returns; PPO's clipped value loss around the values the rows were scored with,
              ``critic.epochs`` passes, ``critic.value_clip``)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from marl_cli.core.samples import Sample

if TYPE_CHECKING:
    import torch


class Scored(Protocol):
    """A token row the critic reads: a prompt (the state) and a completion (the action; may be empty)."""

    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass
class Regression:
    """Values at ``position`` (``critics.critic.POSITIONS``) of every row of a batch, for the heads ``heads``,
    regressed toward ``targets``.

    ``targets`` holds one item per row with n × len(``heads``) numbers, position-major: n = the row's completion
    length for ``token`` (a list of floats per row with one head), 1 for ``state`` and ``action`` (a (N,) tensor
    or list with one head, (N, len(heads)) with several). ``old_values`` (the same layout) are V_old of the clipped
    loss: given, they must be the critic's values before this update (``token_values`` for the token position);
    None: the update reads them first.
    """

    position: str
    targets: Sequence[Any] | torch.Tensor
    heads: Sequence[int] = (0,)
    old_values: Sequence[Any] | torch.Tensor | None = None


@dataclass
class CriticBatch:
    """What one update regresses: ``rows`` and the regressions over them (one forward pass of a row serves all)."""

    rows: Sequence[Scored]
    regressions: list[Regression]


@dataclass
class StateRow:
    """A state as a row: its prompt, no completion (what the ``state`` position reads, at half the cost)."""

    prompt_ids: list[int]
    completion_ids: list[int]


def state_row(prompt_ids: Sequence[int]) -> StateRow:
    return StateRow(list(prompt_ids), [])


def prompt_only(row: Scored) -> StateRow:
    """``row``'s state alone: its prompt, no completion."""
    return state_row(row.prompt_ids)


@dataclass
class Transition:
    """One agent's utterance as a transition (s, a, r, s′, done), in tokens.

    ``prompt_ids`` is the state s, ``completion_ids`` the action a, ``next_prompt_ids`` the state s′ the agent
    acts in next (None when ``done``: the episode ended, the next value is 0); ``step`` is the RL step it was
    collected at, ``role`` the agent.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    done: bool
    next_prompt_ids: list[int] | None
    step: int
    role: str


Annotate = Callable[[Any, list[Sample]], None]
"""``(critic, its rows) -> None``: put the values the estimator reads on the rows (``Sample.estimates``)."""
Update = Callable[[Any, Any, list[Sample], Any, int, random.Random], dict[str, float]]
"""``(critic, its replay buffer or None, its rows of this step, the run config, step, rng) -> statistics``: one RL
step's training of the critic (``critics.critic.Critic.update`` on the batches the algorithm builds)."""


@dataclass(frozen=True)
class ValueLearning:
    """What an algorithm needs from its critic, and how it trains it.

    Args:
        level: the kind of critic it reads (``critic.name``): ``token`` (V(s_t) before every completion token) or
            ``utterance`` (values of the state a turn starts in, and of its utterance).
        annotate: puts the critic's values on the rows (see ``Annotate``).
        update: trains the critic on a step's rows (see ``Update``).
        heads: the value heads on the critic's model.
        target_copy: the critic keeps a Polyak-averaged target copy (``critic.tau``; ``Critic.soft_update``).
        replay: the critic keeps a replay buffer of transitions (``critic.replay_capacity``).
        value_clip: PPO's value clipping applies (``critic.value_clip``); False: plain MSE.
        settings: the ``critic.*`` keys it reads beyond every critic's own (model, optimiser, mini-batch, warm-up,
            scope); a key another algorithm declares and this one does not must stay at its default.
    """

    level: str
    annotate: Annotate
    update: Update
    heads: int = 1
    target_copy: bool = False
    replay: bool = False
    value_clip: bool = True
    settings: tuple[str, ...] = ()


ON_POLICY_SETTINGS = ("epochs", "value_clip")
"""The settings of a regression to this step's returns."""


def annotate_tokens(critic: Any, rows: list[Sample]) -> None:
    """V(s_t) before each completion token, as ``Sample.estimates["values"]``."""
    for s, values in zip(rows, critic.token_values(rows), strict=True):
        s.estimates["values"] = values


def annotate_states(critic: Any, rows: list[Sample]) -> None:
    """V of the state each row's turn starts in, as ``Sample.estimates["value"]``."""
    for s, v in zip(rows, critic.state_values(rows)[:, 0].tolist(), strict=True):
        s.estimates["value"] = v


def regress_token_returns(critic: Any, replay: Any, rows: list[Sample], cfg: Any, step: int,
                          rng: random.Random) -> dict[str, float]:
    """Every token's value toward its return (``estimates["returns"]``), clipped around the values it was scored
    with (``estimates["values"]``)."""
    regression = Regression("token", [s.estimates["returns"] for s in rows],
                            old_values=[s.estimates["values"] for s in rows])
    return critic.update(CriticBatch(rows, [regression]), rng)


def regress_state_returns(critic: Any, replay: Any, rows: list[Sample], cfg: Any, step: int,
                          rng: random.Random) -> dict[str, float]:
    """Each state's value (its prompt only) toward the row's return, clipped around the value it was scored with."""
    import torch

    regression = Regression("state", torch.tensor([s.estimates["returns"][0] for s in rows], dtype=torch.float64),
                            old_values=torch.tensor([s.estimates["value"] for s in rows], dtype=torch.float64))
    return critic.update(CriticBatch([prompt_only(s) for s in rows], [regression]), rng)


TOKEN_RETURNS = ValueLearning("token", annotate_tokens, regress_token_returns, settings=ON_POLICY_SETTINGS)
"""A token-level critic regressed to this step's returns (PPO)."""
STATE_RETURNS = ValueLearning("utterance", annotate_states, regress_state_returns, settings=ON_POLICY_SETTINGS)
"""An utterance-level critic of states regressed to this step's returns (MARFT)."""
