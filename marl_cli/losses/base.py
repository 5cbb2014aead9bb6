"""What a loss term is to the learner: a plug-in kind added to TRL's policy loss (``loss=<name>``, its settings
``loss.*``; ``loss=none`` adds nothing).

A term registers itself beside its class: ``LOSS_TERMS.register(name, schema=..., check=...)(LossKind(build))``.
``build(settings, trainer)`` gives one policy's term from that policy's settings (``loss`` with
``policy.trainers.<policy>.loss`` over it, ``config.team.policy_loss``) and its ``trainer`` settings, or None where
the settings switch it off. The learner (``training/learner/policy_trainer.py``) calls it: ``prepare`` on each
mini-batch it collates, the term's value added to TRL's loss on every optimiser step, ``after_step`` with the step's
token-mean entropy, and ``state_dict`` in every checkpoint (under the term's name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from marl_cli.config.registry import Registry
from marl_cli.core.samples import Sample

if TYPE_CHECKING:
    from marl_cli.core.world import World


class LossTerm(Protocol):
    """One policy's term of the loss.

    Attributes:
        entropies: it reads the per-token entropies of the loss's forward pass.
        every_row: it has a gradient on rows without an advantage, so they stay in the batch.
    """

    entropies: bool
    every_row: bool

    def prepare(self, batch: dict[str, Any], rows: list[Sample], counted: list[bool], world: World,
                dtype: Any) -> None:
        """Put what it needs of a mini-batch's ``rows`` (every process's; ``counted``: whose tokens the loss counts)
        into this process's ``batch`` (tensors of ``dtype``)."""

    def __call__(self, batch: dict[str, Any], entropies: Any, mask: Any, step: int) -> tuple[Any, dict[str, float]]:
        """Its value on a mini-batch (``mask``: the tokens the loss counts) at RL step ``step``, and statistics."""

    def after_step(self, entropy_sum: float, tokens: float) -> None:
        """The step's entropy sum and token count over every process's counted rows, after its updates."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class LossKind:
    """A registered loss term: ``build(settings, trainer)`` → one policy's ``LossTerm``, or None (off)."""

    build: Callable[[Any, Any], LossTerm | None]


LOSS_TERMS: Registry[LossKind] = Registry("loss.name", "loss")
LOSS_TERMS.register("none")(LossKind(lambda settings, trainer: None))
