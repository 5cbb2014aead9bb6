"""Generalised Advantage Estimation (Schulman et al. 2016) for the value-model algorithms: the advantages and
returns of token rows (PPO) and of chains of steps (a role's turns; MARFT's agent-by-agent order), the chains
themselves, and PPO's advantage whitening.

    δ_t = r_t + d_t·V(s_{t+1}) − V(s_t)       A_t = δ_t + d_t·λ·A_{t+1}       returns = A + V

with d_t = γ on every link. After a chain's last step A_{t+1} = 0 and
V(s_{t+1}) is 0 (terminal) or the value of the state the episode was cut at (truncated: the bootstrap value).

MARFT (jwliao-ai/MARFT, ``ActionBuffer.compute_gae_and_returns`` in marft/buffers/action_level_buffer.py; the
rewards from marft/envs/math/math_env.py): one chain runs through the agents of a turn in acting order and on to
agent 0 of the next turn. Every link, between two agents of one turn as between turns, is discounted by γ and
carries the GAE by γλ. Each agent's δ uses its own reward and the value of the next agent's state (for the last
agent, agent 0's at the next turn, zeroed when the episode ended there); the math env pays the score to the last
agent of the turn and 0 to the others. A chain cut by the end of the buffer bootstraps from the value of the next
state. That is ``sequence_gae`` over ``acting_order``. One difference: MARFT also multiplies a link inside a turn by the
"episode goes on" mask of that turn, 0 on the first turn of an episode that began inside the buffer, which cuts
those agents apart; here the agents of a turn are always linked.

Keys: a team episode is (task, branch). ``segment`` numbers a role's sub-trajectories inside one episode (a
sub-agent's calls) and every segment takes its place in the team's acting order. A role's chain is one
(task, branch, role, segment), the trajectory ``role_episodes`` in grpo.py groups. Tree rollouts (branch = the
candidate) are not episodes and have no chains.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from marl_cli.core.samples import Sample

if TYPE_CHECKING:
    import torch

TERMINAL = -1
"""``next_index`` of a chain's last step after which the episode ended: the next value is 0."""
TRUNCATED = -2
"""``next_index`` of a chain's last step where the episode was cut: the next value is the step's bootstrap."""


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
        bootstrap: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE of (B, T) rows: (advantages, returns), both 0 where ``mask`` is 0.

    Masked steps are skipped (right padding, or masked tokens inside a row: the next real step follows), so no
    reward or value of theirs, NaN included, reaches a real step. After a row's last real step the next value is
    ``bootstrap[b]`` (a truncated row; give 0 for a terminal one), or 0 for every row when ``bootstrap`` is None.
    """
    import torch

    if rewards.shape != values.shape or mask.shape != values.shape or values.dim() != 2:
        raise ValueError(f"rewards, values and mask must share one (B, T) shape, got {rewards.shape}, "
                         f"{values.shape}, {mask.shape}")
    real = mask.bool()
    next_value = values.new_zeros(values.shape[0]) if bootstrap is None else bootstrap.to(values)
    ahead = values.new_zeros(values.shape[0])
    steps = []
    for t in reversed(range(values.shape[1])):
        here = real[:, t]
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * ahead
        steps.append(torch.where(here, step, 0.0))
        ahead = torch.where(here, step, ahead)
        next_value = torch.where(here, values[:, t], next_value)
    advantages = torch.stack(steps[::-1], dim=1) if steps else torch.zeros_like(values)
    return advantages, torch.where(real, advantages + values, 0.0)


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """PPO's advantage whitening over the entries where ``mask`` is 1, as verl's ``masked_whiten``:

        x̂ = (x − μ) / √(σ² + ε)        (+ μ again unless ``shift_mean``)

    μ the masked mean, σ² the unbiased (n − 1) masked variance. Unlike verl, masked-out entries come back 0.
    Fewer than two entries have no unbiased variance: ValueError.
    """
    import torch

    real = mask.bool()
    chosen = values[real]
    if chosen.numel() < 2:
        raise ValueError(f"whiten needs at least two entries under the mask, got {chosen.numel()}")
    mean = chosen.mean()
    out = (values - mean) * torch.rsqrt(chosen.var(correction=1) + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(real, out, 0.0)


def sequence_gae(rewards: torch.Tensor, values: torch.Tensor, next_index: torch.Tensor, gamma: float, lam: float,
                 bootstrap: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-level GAE over chains given by successor links: (advantages, returns) of N steps in any order.

    ``next_index[i]`` is the step after i in its episode, ``TERMINAL`` (−1: next value 0) or ``TRUNCATED`` (−2:
    next value ``bootstrap[i]``). Every link is discounted by γ (MARFT's rule). Steps are computed in order of their
    distance to their chain's end, every successor before its predecessors; a cycle is a ValueError.
    """
    import torch

    if rewards.shape != values.shape or next_index.shape != values.shape or values.dim() != 1:
        raise ValueError(f"rewards, values and next_index must share one (N,) shape, got {rewards.shape}, "
                         f"{values.shape}, {next_index.shape}")
    nxt = next_index.long()
    cut = nxt == TRUNCATED
    if bootstrap is None and bool(cut.any()):
        raise ValueError("next_index marks truncated steps (-2) but no bootstrap values were given")
    levels = chain_levels(nxt)
    d = torch.full_like(values, gamma)
    linked, succ = nxt >= 0, nxt.clamp(min=0)
    end_value = values.new_zeros(values.shape) if bootstrap is None else torch.where(cut, bootstrap.to(values), 0.0)
    delta = rewards + d * torch.where(linked, values[succ], end_value) - values
    advantages = torch.zeros_like(values)
    for level in levels:
        ahead = torch.where(linked[level], advantages[succ[level]], 0.0)
        advantages[level] = delta[level] + d[level] * lam * ahead
    return advantages, advantages + values


def chain_levels(next_index: torch.Tensor) -> list[torch.Tensor]:
    """The step indices grouped by distance to their chain's end (0: the last steps), so that every step's
    successor is in an earlier group; one pass per step of the longest chain. A link out of range or a cycle is a
    ValueError."""
    import torch

    n = next_index.numel()
    if bool(((next_index < TRUNCATED) | (next_index >= n)).any()):
        raise ValueError(f"next_index must be -2, -1 or a step index below {n}")
    succ = next_index.clamp(min=0)
    depth = torch.where(next_index < 0, 0, -1)
    levels = [torch.nonzero(depth == 0).flatten()]
    while bool((depth < 0).any()):
        ready = (depth < 0) & (depth[succ] == len(levels) - 1)
        if not bool(ready.any()):
            raise ValueError("next_index has a cycle: some steps never reach a chain's end")
        depth[ready] = len(levels)
        levels.append(torch.nonzero(ready).flatten())
    return levels


def acting_order(keys: Sequence[tuple[Hashable, int, str]], order: Mapping[str, int]) -> torch.Tensor:
    """MARFT's agent-sequential ``next_index``: keys are (episode, turn, role) per row (``team_keys``), ``order``
    each role's position in a turn. An episode's rows run by (turn, position); each row's successor is the next
    one and the last row is ``TERMINAL``. Two rows of one (episode, turn, role) are a ValueError."""
    unknown = sorted({role for _, _, role in keys} - set(order))
    if unknown:
        raise ValueError(f"roles {unknown} have no position in the acting order {dict(order)}")
    return _link([(episode, (turn, order[role])) for episode, turn, role in keys])


def turn_order(keys: Sequence[tuple[Hashable, int]]) -> torch.Tensor:
    """A role's turn chain as ``next_index``: keys are (trajectory, turn) per row (``role_keys``); each row's
    successor is the same trajectory's next turn, its last turn is ``TERMINAL``."""
    return _link([(trajectory, (turn,)) for trajectory, turn in keys])


def team_keys(samples: Sequence[Sample]) -> list[tuple[tuple[int, int], int, str]]:
    """(episode, turn, role) of every row for ``acting_order``: the team episode is (task, branch)."""
    return [((s.task, s.branch), s.turn, s.role) for s in samples]


def role_keys(samples: Sequence[Sample]) -> list[tuple[tuple[int, int, str, int], int]]:
    """(trajectory, turn) of every row for ``turn_order``: the trajectory is (task, branch, role, segment), as in
    ``role_episodes``."""
    return [((s.task, s.branch, s.role, s.segment), s.turn) for s in samples]


def _link(rows: Sequence[tuple[Hashable, tuple[int, ...]]]) -> torch.Tensor:
    """``next_index`` of rows given as (chain, position): within a chain, ascending positions are linked in turn."""
    import torch

    chains: dict[Hashable, list[tuple[tuple[int, ...], int]]] = defaultdict(list)
    for i, (chain, position) in enumerate(rows):
        chains[chain].append((position, i))
    next_index = [TERMINAL] * len(rows)
    for chain, members in chains.items():
        members.sort()
        for (position, i), (following, j) in pairwise(members):
            if position == following:
                raise ValueError(f"rows {i} and {j} of chain {chain!r} share the position {position}")
            next_index[i] = j
    return torch.tensor(next_index, dtype=torch.long)
