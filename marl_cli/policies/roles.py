"""The policy regimes by name and the role→policy map each gives (no models: safe to use while validating)."""

from __future__ import annotations

from typing import Any

from marl_cli.config.errors import ConfigError

REGIMES = ("shared", "per_role", "lora_per_role")
LORA_BASE = "lora_base"
"""Where a lora_per_role run keeps its frozen (warm-started) base model, under the run dir."""


def assign_roles(policy_cfg: Any, roles: list[str]) -> dict[str, str]:
    """Map each role to the name of the policy it acts through."""
    if policy_cfg.name not in REGIMES:
        raise ConfigError(f"policy.name={policy_cfg.name!r} is not a regime; choose from: {', '.join(REGIMES)}")
    explicit = dict(policy_cfg.assignment or {})
    unknown = sorted(set(explicit) - set(roles))
    if unknown:
        raise ConfigError(f"policy.assignment names roles {unknown} that the workflow lacks; roles: {roles}")
    default = {role: ("shared" if policy_cfg.name == "shared" else role) for role in roles}
    return {role: explicit.get(role, default[role]) for role in roles}
