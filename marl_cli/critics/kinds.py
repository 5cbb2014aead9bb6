"""What a value model is to a config: its kind (``critic.name``: none, token, utterance), the level of value it
scores, and the rules between it and the algorithm that reads it. The critic itself (its model, optimiser, target
network and replay buffer) is ``marl_cli.critics``; the loop runs it (``critics.phase``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marl_cli.algorithms.base import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.config.schema import CriticConfig, ModelConfig, check_warmup
from marl_cli.config.team import MODEL_KEYS, merged


@dataclass(frozen=True)
class CriticKind:
    """A kind of value model.

    Args:
        level: what it scores: ``token`` (V(s_t) before every completion token), ``utterance`` (V of the state a
            turn starts in; Q of the turn's utterance for ArCHer), or None (no critic).
    """

    level: str | None = None


def check_critic(cfg: Any) -> None:
    """The critic is the one the algorithm reads (none for a critic-free one), and its settings are ones that
    algorithm uses."""
    algorithm, kind = ALGORITHMS.get(cfg.algorithm.name), CRITICS.get(cfg.critic.name)
    if algorithm.critic is None and kind.level is not None:
        levels = {name: ALGORITHMS.get(name).critic for name in ALGORITHMS.names()}
        readers = ", ".join(f"{name} (critic={level})" for name, level in levels.items() if level)
        raise ConfigError(f"critic={cfg.critic.name}: algorithm={cfg.algorithm.name} is critic-free; a value model is "
                          f"read by algorithm={readers}")
    if algorithm.critic != kind.level:
        raise ConfigError(f"algorithm={cfg.algorithm.name} learns a {algorithm.critic}-level value model: "
                          f"{'add' if kind.level is None else 'use'} critic={algorithm.critic}")
    merged(cfg.model, cfg.critic.model, ModelConfig, "critic.model", MODEL_KEYS)
    defaults = CriticConfig(name=cfg.critic.name)
    if kind.level is None:
        unused = tuple(key for key in cfg.critic if key != "name")
    else:
        unused = tuple(key for key in declared_settings() if key not in algorithm.values.settings)
    for key in unused:
        if cfg.critic[key] != getattr(defaults, key):
            raise ConfigError(f"critic.{key}={cfg.critic[key]} is not used by algorithm={cfg.algorithm.name}"
                              f"{' (critic=none)' if kind.level is None else ''}")
    if kind.level is not None and cfg.critic.share_trunk:
        check_shared_trunk(cfg)
    if kind.level is not None:
        check_warmup("critic.warmup_steps", cfg.critic.warmup_steps, cfg.trainer.steps)


def declared_settings() -> list[str]:
    """The ``critic.*`` keys some algorithm declares it reads (``ValueLearning.settings``), in the order declared."""
    keys: dict[str, None] = {}
    for name in ALGORITHMS.names():
        values = ALGORITHMS.get(name).values
        keys.update(dict.fromkeys(values.settings if values else ()))
    return list(keys)


def check_shared_trunk(cfg: Any) -> None:
    """A value head on a policy's own model trains that model between the policy's steps: one full model per
    critic, trained every step (no copy, adapter, sharded learner or schedule that holds a policy still)."""
    where = "critic.share_trunk=true"
    rules = [(cfg.critic.scope == "team", "needs critic.scope=policy (a trunk is one policy's model)"),
             (bool(cfg.critic.model), "puts the head on the policy's model: leave critic.model empty"),
             (cfg.policy.name == "lora_per_role", "needs full-model policies (an adapter's base is shared)"),
             (cfg.trainer.sharding != "none", "needs trainer.sharding=none (the policy's model is a copy of the "
                                              "sharded learner)"),
             (bool(cfg.trainer.frozen_roles) or cfg.trainer.alternate_every > 0 or cfg.trainer.swap_roles_every > 0,
              "would train a policy its schedule holds still (frozen_roles, alternate_every, swap_roles_every)")]
    for broken, why in rules:
        if broken:
            raise ConfigError(f"{where} {why}")


CRITICS: Registry[CriticKind] = Registry("critic.name", "critic", check=check_critic)
CRITICS.register("none")(CriticKind())
CRITICS.register("token")(CriticKind("token"))
CRITICS.register("utterance")(CriticKind("utterance"))
