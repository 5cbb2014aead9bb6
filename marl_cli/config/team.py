"""Heterogeneous teams, as settings: what one policy changes from the run's ``model`` and ``trainer``
(``policy.models.<policy>``, ``policy.trainers.<policy>``), what one role changes from the run's sampling
(``rollout.roles.<role>``, ``eval.roles.<role>``), and the ``Schedule`` of which policies train at a step and which
role each acts for (``trainer.alternate_every``, ``trainer.swap_roles_every``). Each change is merged onto its
schema and checked (keys, types, ranges: ``check_schema``, the check every typed node of a config gets) before a
model is built.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import schema_of
from marl_cli.config.schema import LossConfig, ModelConfig, RoleSampling, TrainerConfig, marked

MODEL_KEYS = ("name_or_path", "tiny", "dtype")
"""What a policy's model may change: which model, and its dtype. Prompting is per role (``model.system_prompts``,
``rollout.roles.<role>.chat_template_kwargs``), so one role reads the same prompt whichever policy serves it."""
TRAINER_KEYS = marked(TrainerConfig, "per_policy")
"""What a policy's update may change from ``trainer`` (the keys marked ``per_policy``; its loss term's settings too:
``policy_loss``); the step schedule, logging and checkpoints are the run's."""


def _typed_nodes(node: DictConfig, path: str = "") -> Iterator[tuple[str, DictConfig, type]]:
    """Every config node backed by a dataclass schema, with its dotted path (``"trainer."``)."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        yield path, node, schema
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from _typed_nodes(child, f"{path}{key}.")


def check_schema(cfg: DictConfig, path: str = "") -> None:
    """Keys no schema declares (``+trainer.foo=1``) and values outside their field's bounds; ``path`` prefixes the
    keys named in errors."""
    for where, node, schema in _typed_nodes(cfg, path):
        fields = {f.name: f for f in dataclasses.fields(schema)}
        for key in node:
            if key not in fields:
                raise ConfigError(f"{where}{key}: no such key; valid keys: {', '.join(fields)}")
            bounds = fields[key].metadata
            value = node[key]
            if not bounds or value is None:
                continue
            ge, gt, le = bounds.get("ge"), bounds.get("gt"), bounds.get("le")
            if (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le):
                wanted = " and ".join(f"{op} {b}" for op, b in ((">=", ge), (">", gt), ("<=", le)) if b is not None)
                raise ConfigError(f"{where}{key}={value}: must be {wanted}")


def merged(base: Any, change: Any, schema: type, where: str, allowed: tuple[str, ...] | None = None) -> DictConfig:
    """``base`` (resolved) with ``change`` merged over it, as a node of ``schema``; a key ``allowed`` (None: any of
    the schema's) or the schema lacks, a value of the wrong type or out of its range is a one-line error naming
    ``where``."""
    if isinstance(change, DictConfig):
        change = OmegaConf.to_container(change, resolve=True)
    if not isinstance(change, dict):
        raise ConfigError(f"{where}: must map keys to values, got {change!r}")
    names = allowed if allowed is not None else tuple(f.name for f in dataclasses.fields(schema))
    extra = sorted(set(change) - set(names))
    if extra:
        raise ConfigError(f"{where}.{extra[0]}: not a key this can change; valid keys: {', '.join(names)}")
    node = OmegaConf.structured(schema)
    try:
        node.merge_with(OmegaConf.to_container(base, resolve=True) if isinstance(base, DictConfig) else base or {},
                        change)
    except OmegaConfBaseException as exc:
        what = str(exc.msg).splitlines()[0]
        if isinstance(exc, ConfigKeyError):
            kind = getattr(exc, "object_type", None)
            keys = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else []
            what = "no such key" + (f"; valid keys: {', '.join(keys)}" if keys else "")
        raise ConfigError(f"{where}.{exc.full_key}: {what}") from exc
    check_schema(node, f"{where}.")
    return node


def policy_model(cfg: DictConfig, name: str) -> DictConfig:
    """The model config policy ``name`` starts from: ``model`` with ``policy.models.<name>`` over it."""
    return merged(cfg.model, cfg.policy.models.get(name, {}), ModelConfig, f"policy.models.{name}", MODEL_KEYS)


def policy_models(cfg: DictConfig) -> dict[str, DictConfig]:
    """The policies that start from a model of their own (``policy.models``), with its config."""
    return {name: policy_model(cfg, name) for name in cfg.policy.models}


def model_key(model_cfg: Any) -> str:
    """What tells two model configs apart: the config, resolved, as sorted JSON (equal keys: the same model)."""
    return json.dumps(OmegaConf.to_container(model_cfg, resolve=True), sort_keys=True)


def _policy_changes(cfg: DictConfig, name: str) -> dict[str, Any]:
    change = cfg.policy.trainers.get(name, {})
    return OmegaConf.to_container(change, resolve=True) if isinstance(change, DictConfig) else dict(change or {})


def policy_trainer(cfg: DictConfig, name: str) -> DictConfig:
    """The update settings of policy ``name``: ``trainer`` with ``policy.trainers.<name>`` over it (but its ``loss``:
    ``policy_loss``)."""
    change = {key: value for key, value in _policy_changes(cfg, name).items() if key != "loss"}
    return merged(cfg.trainer, change, TrainerConfig, f"policy.trainers.{name}", TRAINER_KEYS)


def policy_loss(cfg: DictConfig, name: str) -> DictConfig:
    """The loss term settings of policy ``name``: ``loss`` with ``policy.trainers.<name>.loss`` over it (any key of
    the term's schema but its name)."""
    schema = schema_of("loss", cfg.loss.name) or LossConfig
    keys = tuple(f.name for f in dataclasses.fields(schema) if f.name != "name")
    return merged(cfg.loss, _policy_changes(cfg, name).get("loss", {}), schema, f"policy.trainers.{name}.loss", keys)


def _role_table(cfg: DictConfig, key: str, role: str) -> dict[str, Any]:
    """The keys ``<key>.<role>`` sets (checked against ``RoleSampling``), without the ones left null."""
    change = (OmegaConf.select(cfg, key, default=None) or {}).get(role, {})
    node = merged(None, change, RoleSampling, f"{key}.{role}")
    return {k: v for k, v in OmegaConf.to_container(node).items() if v is not None}


def role_sampling(cfg: DictConfig, role: str, evaluation: bool = False) -> dict[str, Any]:
    """What ``role``'s sampling changes from the group's: ``rollout.roles.<role>`` in training; in evaluation the
    same but its temperature (evaluation samples at ``eval.temperature``), then ``eval.roles.<role>``."""
    changes = _role_table(cfg, "rollout.roles", role)
    if evaluation:
        changes.pop("temperature", None)
        changes.update(_role_table(cfg, "eval.roles", role))
    return changes


def check_role_sampling(cfg: DictConfig) -> None:
    """``rollout.roles`` and ``eval.roles`` (whose roles ``validate.check_run`` checks with the other per-role keys)
    hold keys and values ``RoleSampling`` takes; training rollouts sample (a role's training temperature is > 0)."""
    for key in ("rollout.roles", "eval.roles"):
        for role in OmegaConf.select(cfg, key, default=None) or {}:
            changes = _role_table(cfg, key, role)
            if key == "rollout.roles" and changes.get("temperature") == 0:
                raise ConfigError(f"rollout.roles.{role}.temperature=0: training rollouts sample (greedy is for "
                                  f"evaluation: eval.roles.{role}.temperature=0)")


@dataclass(frozen=True)
class Schedule:
    """Which policies train at a step (``trainer.alternate_every``: in turn, N steps each) and which policy acts
    for each role (``trainer.swap_roles_every``: every N steps every role moves one policy along the order, so two
    policies trade roles, CORY's pioneer and observer). Steps count from 1.

    Args:
        order: the policies in their order (``trainer.alternate_order``, else as the roles first name them).
        trainable: the policies that train at all (not in ``policy.frozen``).
        alternate_every: 0: every trainable policy trains every step.
        swap_every: 0: the roles keep their policies.
    """

    order: tuple[str, ...]
    trainable: frozenset[str]
    alternate_every: int = 0
    swap_every: int = 0

    @classmethod
    def of(cls, cfg: DictConfig, role_map: dict[str, str]) -> Schedule:
        names = list(dict.fromkeys(role_map.values()))
        order = list(cfg.trainer.alternate_order) or names
        return cls(tuple(order), frozenset(set(names) - set(cfg.policy.frozen)), cfg.trainer.alternate_every,
                   cfg.trainer.swap_roles_every)

    def training(self, step: int) -> frozenset[str]:
        """The policies that train at ``step``."""
        if not self.alternate_every:
            return self.trainable
        turns = [name for name in self.order if name in self.trainable]
        return frozenset({turns[((max(step, 1) - 1) // self.alternate_every) % len(turns)]})

    def routing(self, role_map: dict[str, str], step: int) -> dict[str, str]:
        """Role → the policy acting for it at ``step`` (step 0, before training: as at step 1)."""
        if not self.swap_every:
            return dict(role_map)
        shift = (max(step, 1) - 1) // self.swap_every
        return {role: self.order[(self.order.index(name) + shift) % len(self.order)]
                for role, name in role_map.items()}

    def steps_of(self, name: str, total: int) -> int:
        """How many of the steps 1..``total`` train policy ``name`` (the length of its learning-rate schedule)."""
        return sum(name in self.training(step) for step in range(1, total + 1))


def check_team(cfg: DictConfig, role_map: dict[str, str]) -> None:
    """The per-policy settings name policies the run has (each merged and checked), and the schedule has
    something to train: one line each, before any model is built. (Under an adapter regime a policy's own model is
    its own base: ``policies.roles.lora_bases``.)"""
    names = list(dict.fromkeys(role_map.values()))
    regime = cfg.policy.name
    for key in ("policy.models", "policy.trainers", "policy.frozen", "trainer.alternate_order"):
        unknown = sorted(set(OmegaConf.select(cfg, key)) - set(names))
        if unknown:
            hint = " (one model serves every role: give roles their own policies with policy=per_role)" \
                if regime == "shared" else " (map roles to policies with +policy.assignment.<role>=<policy>)"
            raise ConfigError(f"{key} names policies {unknown} that policy={regime} lacks; its policies: "
                              f"{names}{hint}")
    for name in cfg.policy.models:
        policy_model(cfg, name)
    for name in cfg.policy.trainers:
        policy_trainer(cfg, name)
        policy_loss(cfg, name)
    _check_schedule(cfg, role_map)


def _check_schedule(cfg: DictConfig, role_map: dict[str, str]) -> None:
    """A schedule that trains something, and the roles' policies it moves exist."""
    schedule, trainer = Schedule.of(cfg, role_map), cfg.trainer
    names = list(dict.fromkeys(role_map.values()))
    if trainer.alternate_order and sorted(trainer.alternate_order) != sorted(names):
        raise ConfigError(f"trainer.alternate_order={list(trainer.alternate_order)} must list each policy once: "
                          f"{names}")
    trained_roles = set(role_map) - set(trainer.frozen_roles)
    if trainer.steps and (not schedule.trainable or not trained_roles):
        raise ConfigError(f"nothing to train: policy.frozen={list(cfg.policy.frozen)} and trainer.frozen_roles="
                          f"{list(trainer.frozen_roles)} leave no policy and role to update (or set trainer.steps=0)")
    if trainer.alternate_every and len(schedule.trainable) < 2:
        raise ConfigError(f"trainer.alternate_every={trainer.alternate_every} trains policies in turn; this run "
                          f"trains {sorted(schedule.trainable)} (it needs two or more)")
    if trainer.swap_roles_every and len(names) < 2:
        raise ConfigError(f"trainer.swap_roles_every={trainer.swap_roles_every} swaps roles between policies; "
                          f"policy={cfg.policy.name} has {names} (use policy=per_role)")
    if (trainer.alternate_every or trainer.swap_roles_every) and trainer.role != "all":
        raise ConfigError(f"trainer.role={trainer.role}: decoupled trainers keep their roles and train every step "
                          "(no trainer.alternate_every or trainer.swap_roles_every)")
