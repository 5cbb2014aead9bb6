"""The policy regimes by name and the role→policy map each gives (no models: safe to use while validating).

A regime says which policy a role acts through by default and what a policy is: a full model, or a
LoRA adapter on a frozen base model (``adapters``: the policies of one model config share a base, ``lora_bases``;
each base is warm-started as a whole first, saved once per run under ``lora_base/`` or ``lora_base_<policy>/``,
and checkpoints hold only the adapters). A new regime is one
``REGIMES.register`` line (here, or in a plug-in module with its schema and check) plus its
``conf/policy/<name>.yaml``. The rules every regime shares (roles and their policies, decoupled trainers,
what adapters cannot do) are ``check_regime``, run by ``config.validate`` before a run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from marl_cli.algorithms.base import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry
from marl_cli.config.team import check_team, model_key, policy_models
from marl_cli.policies.scripted import check_scripted, scripted_roles

LORA_BASE = "lora_base"
"""The name of an adapter regime's frozen (warm-started) base model of the run's ``model``, and where the run dir
keeps it; a base of another model config is ``lora_base_<its first policy>`` (``lora_bases``)."""


@dataclass(frozen=True)
class Regime:
    """How roles map to policies, and whether the policies are adapters on frozen base models.

    Args:
        policy_of: the policy a role acts through unless ``policy.assignment`` names another.
        adapters: each policy is a LoRA adapter on the frozen base model of its model config (``lora_bases``).
    """

    policy_of: Callable[[str], str]
    adapters: bool = False


def uses_adapters(policy_cfg: Any) -> bool:
    """Whether ``policy_cfg``'s regime makes every policy a LoRA adapter on a frozen base."""
    return REGIMES.get(policy_cfg.name).adapters


def lora_bases(role_map: dict[str, str], model_cfg: Any, models: dict[str, Any]) -> dict[str, str]:
    """Under an adapter regime, the frozen base each policy's adapter sits on, by policy. The policies whose model
    config (their entry of ``models``, ``config.team.policy_models``, else ``model_cfg``) is the same share one base:
    ``model_cfg``'s is ``lora_base`` (``LORA_BASE``), any other ``lora_base_<its first policy>`` (in the order the
    roles of ``role_map`` first name them)."""
    default = model_key(model_cfg)
    named: dict[str, str] = {}
    bases = {}
    for policy in dict.fromkeys(role_map.values()):
        key = model_key(models.get(policy, model_cfg))
        bases[policy] = named.setdefault(key, LORA_BASE if key == default else f"{LORA_BASE}_{policy}")
    return bases


def assign_roles(policy_cfg: Any, roles: list[str]) -> dict[str, str]:
    """Map each role a model acts for to the name of the policy it acts through (a scripted role,
    ``policy.scripted``, is no policy's: ``policies.scripted``)."""
    regime = REGIMES.get(policy_cfg.name)
    explicit = dict(policy_cfg.assignment or {})
    unknown = sorted(set(explicit) - set(roles))
    if unknown:
        raise ConfigError(f"policy.assignment names roles {unknown} that the workflow lacks; roles: {roles}")
    scripted = scripted_roles(policy_cfg)
    return {role: explicit.get(role, regime.policy_of(role)) for role in roles if role not in scripted}


def role_map(cfg: Any) -> dict[str, str]:
    """The run's role → policy map: ``assign_roles`` over the workflow's roles. ``build_run`` computes it once and
    the run carries it (``Run.role_map``) to whoever acts with it; the config checks that run before anything is
    built (the regime's, the vLLM backend's engine count) read it from here too."""
    return assign_roles(cfg.policy, list(cfg.workflow.roles))


def sub_roles(cfg: Any, role_map: dict[str, str]) -> list[str]:
    """The sub roles decoupled M-GRPO trainers exchange (none for ``trainer.role=all``), after checking the
    setup: decoupled trainers need a hierarchical algorithm and the sub roles on their own full model."""
    role = cfg.trainer.role
    if role == "all":
        return []
    if not ALGORITHMS.get(cfg.algorithm.name).hierarchical:
        raise ConfigError(f"trainer.role={role} runs decoupled M-GRPO trainers; it needs algorithm=m_grpo")
    subs = [r for r in cfg.algorithm.aligned_roles if r in role_map]
    if not subs:
        raise ConfigError(f"trainer.role={role}: the workflow has none of algorithm.aligned_roles "
                          f"{list(cfg.algorithm.aligned_roles)}")
    shared = {role_map[r] for r in subs} & {p for r, p in role_map.items() if r not in subs}
    if uses_adapters(cfg.policy) or shared:
        raise ConfigError(f"trainer.role={role}: the sub-agent must have its own full model (policy=per_role)")
    return subs


def check_adapters(cfg: Any) -> None:
    """What a regime of adapters on frozen bases cannot do: place policies on devices, shard full-model
    learners, start from full-model checkpoints, or evaluate without trained adapters."""
    name = cfg.policy.name
    if cfg.policy.devices:
        raise ConfigError(f"policy.devices places full-model policies; policy={name} serves its roles from frozen "
                          "base models on the run's device")
    if cfg.trainer.sharding != "none":
        raise ConfigError(f"trainer.sharding={cfg.trainer.sharding} splits full-model learners across processes; "
                          f"policy={name} trains small adapters on a frozen base (use policy=shared or "
                          "policy=per_role)")
    if cfg.trainer.init_from:
        raise ConfigError(f"trainer.init_from starts full-model policies; policy={name} keeps only adapters")
    if "load" in cfg and not cfg.load:
        raise ConfigError(f"policy={name} without load= has no adapters to evaluate; "
                          "evaluate the base model with policy=shared")


def check_regime(cfg: Any) -> None:
    """Every regime's rules: the scripted roles (``policies.scripted.check_scripted``), the role→policy map
    (``policy.assignment``), decoupled trainers' setup, the team's per-policy settings and schedule
    (``config.team.check_team``) and, for a regime of adapters, ``check_adapters``."""
    check_scripted(cfg)
    roles = role_map(cfg)
    sub_roles(cfg, roles)
    check_team(cfg, roles)
    check_pool(cfg, roles)
    if uses_adapters(cfg.policy):
        check_adapters(cfg)


def check_pool(cfg: Any, roles: dict[str, str]) -> None:
    """An opponent pool (``pool.every`` > 0) snapshots one role's policy into another's: both roles are the
    workflow's and act through different policies of one model, the opponent's is frozen, and one trainer runs."""
    pool = OmegaConf.select(cfg, "pool")
    if pool is None or not pool.every:
        return
    for key in ("learner", "opponent"):
        if pool[key] not in roles:
            raise ConfigError(f"pool.{key}={pool[key]}: not a role acting through a policy; roles: {sorted(roles)}")
    learner, opponent = roles[pool.learner], roles[pool.opponent]
    if learner == opponent:
        raise ConfigError(f"pool.every={pool.every}: pool.learner and pool.opponent act through one policy "
                          f"({learner}); give each its own (policy=per_role)")
    if pool.opponent not in cfg.trainer.frozen_roles:
        raise ConfigError(f"pool.opponent={pool.opponent} plays the pool's snapshots and must not train: add it to "
                          f"trainer.frozen_roles (trainer.frozen_roles=[{pool.opponent}])")
    models = policy_models(cfg)
    if model_key(models.get(learner, cfg.model)) != model_key(models.get(opponent, cfg.model)):
        raise ConfigError(f"pool.every={pool.every}: the learner's policy {learner} and the opponent's {opponent} are "
                          "different models; a snapshot of one cannot play as the other")
    if OmegaConf.select(cfg, "trainer.role", default="all") != "all":
        raise ConfigError("pool.every > 0 runs in one trainer (trainer.role=all)")


REGIMES: Registry[Regime] = Registry("policy.name", "policy", check=check_regime)
REGIMES.register("shared")(Regime(lambda role: "shared"))
REGIMES.register("per_role")(Regime(lambda role: role))
REGIMES.register("lora_per_role")(Regime(lambda role: role, adapters=True))
