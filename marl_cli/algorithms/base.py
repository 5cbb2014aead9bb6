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

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.rollout.samples import Sample

Estimator = Callable[[list[Sample], Any, random.Random, "dict[int, list[int]] | None"],
                     tuple[list[Sample], dict[str, float]]]
"""``(rows, algorithm config, rng, rollouts per task or None) -> (rows as trained with advantages, statistics)``."""


@dataclass(frozen=True)
class Algorithm:
    """An advantage estimator and what it needs.

    Args:
        advantages: the estimator (see ``Estimator``); it may return copies of rows (M-GRPO's alignment).
        modes: the rollout modes (``algorithm.mode``) it is defined for.
        hierarchical: it aligns the sub-agents' trajectories (``algorithm.aligned_roles``), so it
            trains workflows rewarded per trajectory and can run as decoupled main/sub trainers.
        critic: the level of the learned value model it reads (``critic.name``: ``token``, ``utterance``), whose
            values the loop puts on the rows before the estimator runs; None: critic-free.
    """

    advantages: Estimator
    modes: tuple[str, ...] = ("independent",)
    hierarchical: bool = False
    critic: str | None = None


def check_mode(cfg: Any) -> None:
    """The rollout mode (``algorithm.mode``) is one the selected algorithm is defined for, and the turn credit
    (``turn_credit``, ``gamma``, ``norm_group``) one it can give."""
    algorithm = ALGORITHMS.get(cfg.algorithm.name)
    if cfg.algorithm.mode not in algorithm.modes:
        raise ConfigError(f"algorithm.mode={cfg.algorithm.mode} is not defined for algorithm={cfg.algorithm.name}; "
                          f"choose from: {', '.join(algorithm.modes)} (tree rollouts are algorithm=at_grpo)")
    check_turn_credit(cfg.algorithm, algorithm)


def check_turn_credit(cfg: Any, algorithm: Algorithm) -> None:
    """Returns and episode groups follow a role through one episode: independent rollouts of a per-row estimator
    without a critic (a value-based algorithm discounts with ``gamma`` itself)."""
    changed = [f"{key}={cfg[key]}" for key, plain in (("turn_credit", "immediate"), ("norm_group", "turn"))
               if cfg[key] != plain]
    if algorithm.critic is not None:
        if changed:
            raise ConfigError(f"algorithm.{changed[0]}: algorithm={cfg.name} computes its returns with its critic "
                              "(algorithm.gamma, algorithm.lam); turn credit is for grpo and at_grpo")
        return
    if cfg.gamma != 1.0 and cfg.turn_credit != "return":
        raise ConfigError(f"algorithm.gamma={cfg.gamma} discounts returns only: set algorithm.turn_credit=return")
    if changed and algorithm.hierarchical:
        raise ConfigError(f"algorithm.{changed[0]}: algorithm={cfg.name} rewards whole trajectories (every row "
                          "carries its trajectory's reward); turn credit is for grpo and at_grpo")
    if changed and cfg.mode == "tree":
        raise ConfigError(f"algorithm.{changed[0]} follows a role through one episode; tree rollouts branch at every "
                          "turn (a group is one state's K candidates): use algorithm.mode=independent")


ALGORITHMS: Registry[Algorithm] = Registry("algorithm.name", "algorithm", check=check_mode)
