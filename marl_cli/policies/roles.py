"""The policy regimes by name and the role→policy map each gives (no models: safe to use while validating).

A regime says which policy a role acts through by default and what a policy is: a full model, or a
LoRA adapter on one frozen base model (``adapters``: the base is warm-started as a whole first, saved
once per run under ``lora_base/``, and checkpoints hold only the adapters). A new regime is one
``REGIMES.register`` line here plus its ``conf/policy/<name>.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.registry import Registry

LORA_BASE = "lora_base"
"""Where an adapter regime keeps its frozen (warm-started) base model, under the run dir."""


@dataclass(frozen=True)
class Regime:
    """How roles map to policies, and whether the policies are adapters on one frozen base.

    Args:
        policy_of: the policy a role acts through unless ``policy.assignment`` names another.
        adapters: each policy is a LoRA adapter on one frozen base model.
    """

    policy_of: Callable[[str], str]
    adapters: bool = False


REGIMES: Registry[Regime] = Registry("policy.name")
REGIMES.register("shared")(Regime(lambda role: "shared"))
REGIMES.register("per_role")(Regime(lambda role: role))
REGIMES.register("lora_per_role")(Regime(lambda role: role, adapters=True))


def uses_adapters(policy_cfg: Any) -> bool:
    """Whether ``policy_cfg``'s regime makes every policy a LoRA adapter on one frozen base."""
    return REGIMES.get(policy_cfg.name).adapters


def assign_roles(policy_cfg: Any, roles: list[str]) -> dict[str, str]:
    """Map each role to the name of the policy it acts through."""
    regime = REGIMES.get(policy_cfg.name)
    explicit = dict(policy_cfg.assignment or {})
    unknown = sorted(set(explicit) - set(roles))
    if unknown:
        raise ConfigError(f"policy.assignment names roles {unknown} that the workflow lacks; roles: {roles}")
    return {role: explicit.get(role, regime.policy_of(role)) for role in roles}
