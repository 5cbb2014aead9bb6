"""What an algorithm is to the training loop: an advantage estimator and the rollouts it accepts.

An algorithm registers itself beside its estimator: ``ALGORITHMS.register(name, schema=..., check=...)(Algorithm(...))``
(a schema for settings of its own, a check for its rules across keys). ``algorithm.name`` in a config selects
it, and ``config.validate`` checks before a run starts that the rollout mode is one it is defined for
(``check_mode``, every algorithm), then runs its own check.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.values import ValueLearning
from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.core.samples import Sample

Estimator = Callable[[list[Sample], Any, random.Random, "dict[int, list[int]] | None"],
                     tuple[list[Sample], dict[str, float]]]
"""``(rows, algorithm config, rng, rollouts per task or None) -> (rows as trained with advantages, statistics)``;
an algorithm with ``memory`` is also called with ``memory=``, its state across steps."""
Label = Callable[[Callable[[str], Any], bool], str]
"""``(read a key of the run's config, its workflow is single-agent) -> the method's row label in `marl report```."""


@dataclass(frozen=True)
class Algorithm:
    """An advantage estimator and what it needs.

    Args:
        advantages: the estimator (see ``Estimator``); it may return copies of rows (M-GRPO's alignment).
        modes: the rollout modes (``algorithm.mode``) it is defined for.
        hierarchical: it aligns the sub-agents' trajectories (``algorithm.aligned_roles``), so it
            trains workflows rewarded per trajectory and can run as decoupled main/sub trainers.
        values: what it needs from a learned value model and how it trains it (``algorithms/values.py``); the
            loop's critic phase puts the critic's values on the rows before the estimator runs. None: critic-free.
        label: the row label ``marl report`` gives a run trained with it (see ``Label``; the papers' table names).
            None: the algorithm's name.
        memory: the estimator keeps state across steps (SPIRAL's running baselines): the loop owns one dict for it,
            passes it as ``memory=`` at every step, and checkpoints it (a resume restores it exactly).
    """

    advantages: Estimator
    modes: tuple[str, ...] = ("independent",)
    hierarchical: bool = False
    values: ValueLearning | None = None
    label: Label | None = None
    memory: bool = False

    @property
    def critic(self) -> str | None:
        """The level of critic it reads (``critic.name``), or None."""
        return None if self.values is None else self.values.level


def check_mode(cfg: Any) -> None:
    """The rollout mode (``algorithm.mode``) is one the selected algorithm is defined for."""
    algorithm = ALGORITHMS.get(cfg.algorithm.name)
    if cfg.algorithm.mode not in algorithm.modes:
        raise ConfigError(f"algorithm.mode={cfg.algorithm.mode} is not defined for algorithm={cfg.algorithm.name}; "
                          f"choose from: {', '.join(algorithm.modes)} (tree rollouts are algorithm=at_grpo)")


ALGORITHMS: Registry[Algorithm] = Registry("algorithm.name", "algorithm", check=check_mode)
