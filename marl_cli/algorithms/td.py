"""ArCHer's utterance-level critic (Zhou et al. 2024, arXiv 2402.19446): TD targets, the double critic's
regression targets, the advantage its token-level actor is trained on, and the Polyak update of the target critic.

What ArCHer's code does (YifeiZhou02/ArCHer: ``ArcherTrainer.critic_loss`` and ``update`` in
archer/algorithms/archer/trainer.py, ``DoubleCritic`` in archer/models/critic.py, ``soft_update_target_critic`` in
archer/models/archer_agent.py): the critic has two Q heads and two V heads. Each Q_i(s, a) of a stored transition
is regressed to r + γ·(1 − done)·V̄_i(s′), V̄_i the target critic's own i-th V head; each V_i(s) is regressed to
Q̄_i(s, a_π), the target critic's own i-th Q head at an action a_π freshly sampled from the current policy at s.
Neither target takes a minimum over the heads. The actor's advantage, without gradient, is
min(Q_1, Q_2)(s, a_π) − min(V_1, V_2)(s) from the online critic, a_π again a fresh policy action, which is also
the action the actor's log-probability is taken of. After every critic step θ̄ ← (1 − τ)·θ̄ + τ·θ over the
parameters, τ = 0.1 (the trainer's default and the configs'); the target starts as a copy (τ = 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

Pair = tuple["torch.Tensor", "torch.Tensor"]
"""The two heads of a double critic."""


class CriticTargets(NamedTuple):
    """What each head of ArCHer's double critic is regressed to (no gradient)."""

    q1: torch.Tensor
    q2: torch.Tensor
    v1: torch.Tensor
    v2: torch.Tensor


def td_target(rewards: torch.Tensor, next_values: torch.Tensor, dones: torch.Tensor,
              gamma: float) -> torch.Tensor:
    """The one-step TD target y = r + γ·(1 − done)·V̄(s′); a terminal step's next value is ignored (even NaN)."""
    import torch

    return rewards + gamma * torch.where(dones.bool(), 0.0, next_values.to(rewards))


def critic_targets(rewards: torch.Tensor, dones: torch.Tensor, next_v: Pair, policy_q: Pair, gamma: float,
                   clipped: bool = False) -> CriticTargets:
    """ArCHer's regression targets, detached, from the target critic's heads:

        Q_i(s, a) ← r + γ·(1 − done)·V̄_i(s′)        V_i(s) ← Q̄_i(s, a_π),  a_π ~ π(·|s)

    ``next_v`` = (V̄_1, V̄_2)(s′), ``policy_q`` = (Q̄_1, Q̄_2)(s, a_π). ``clipped`` gives both heads the minimum over
    the two target heads instead (min V̄_i in the Q target, min Q̄_i as the V target: clipped double Q, as in
    TD3/SAC); ArCHer's code pairs head i with head i.
    """
    import torch

    if clipped:
        low_v, low_q = torch.minimum(*next_v), torch.minimum(*policy_q)
        next_v, policy_q = (low_v, low_v), (low_q, low_q)
    q1, q2 = (td_target(rewards, v.detach(), dones, gamma) for v in next_v)
    return CriticTargets(q1, q2, policy_q[0].detach(), policy_q[1].detach())


def polyak_update(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    """θ̄ ← (1 − τ)·θ̄ + τ·θ in place, without gradient, over the parameters and floating-point buffers
    (other buffers stay). τ = 1 copies, τ = 0 keeps; ArCHer uses τ = 0.1 after each critic step. Modules whose
    parameter or buffer names or shapes differ are a ValueError."""
    import torch

    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"polyak_update: tau must be in [0, 1], got {tau}")
    pairs = _float_tensors(target), _float_tensors(source)
    if [(n, t.shape) for n, t in pairs[0]] != [(n, t.shape) for n, t in pairs[1]]:
        raise ValueError("polyak_update: the target and source modules' parameter names or shapes differ")
    with torch.no_grad():
        for (_, mine), (_, theirs) in zip(*pairs, strict=True):
            mine.lerp_(theirs.to(mine), tau)


def _float_tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The module's parameters and floating-point buffers by name, in a fixed order."""
    params = list(module.named_parameters())
    buffers = [(f"buffer:{n}", b) for n, b in module.named_buffers() if b.is_floating_point()]
    return params + buffers
