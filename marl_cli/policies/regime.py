"""The role→policy map and the policies it names.

``shared``: every role acts through one model (roles differ by prompt). ``per_role``: each role has
its own full model. ``policy.assignment`` maps roles to policy names explicitly for custom mixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marl_cli.config.errors import ConfigError
from marl_cli.policies.loading import load_model, load_tokenizer, resolve_source

REGIMES = ("shared", "per_role")


@dataclass
class Policy:
    """One trainable model and the roles that act through it."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    roles: list[str] = field(default_factory=list)


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


def build_policies(role_map: dict[str, str], model_cfg: Any, seed: int, workdir: Path,
                   device: torch.device, sources: dict[str, str] | None = None) -> dict[str, Policy]:
    """Load one model per policy name; ``sources`` (e.g. a checkpoint) override where each loads from."""
    base = resolve_source(model_cfg, seed, workdir)
    policies: dict[str, Policy] = {}
    for role, name in role_map.items():
        if name not in policies:
            source = (sources or {}).get(name, base)
            policies[name] = Policy(name, load_model(source, model_cfg.dtype, device), load_tokenizer(source),
                                    source)
        policies[name].roles.append(role)
    return policies
