"""The policies a regime builds, and everything that depends on what a policy is (a full model or an
adapter): building them, the adapter split after the warm-start phase, and loading them back from a
checkpoint (a resume, ``marl eval load=...``).

``shared``: every role acts through one model (roles differ by prompt). ``per_role``: each role has
its own full model. ``lora_per_role``: one peft LoRA adapter per role on a frozen base model, one base per model
config (``roles.lora_bases``: ``lora_base`` for the run's ``model``, ``lora_base_<policy>`` for a policy given its
own in ``policy.models``); each base is warm-started as a whole first, then the adapters are attached
(``attach_all_adapters``).
``policy.assignment`` maps roles to policy names explicitly for custom mixes (three roles on two
policies, say).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from marl_cli.config.errors import ConfigError
from marl_cli.config.team import policy_models
from marl_cli.policies.loading import DTYPES, load_model, load_tokenizer, resolve_source, save_once
from marl_cli.policies.roles import LORA_BASE, REGIMES, lora_bases, uses_adapters

_ADAPTER_FILE = "adapter_model.safetensors"


@dataclass
class Policy:
    """One trainable model (or LoRA adapter on a shared base) and the roles that act through it."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    roles: list[str] = field(default_factory=list)
    adapter: str | None = None
    compute_dtype: torch.dtype = torch.float32
    """The dtype forward passes run in; a bf16/fp16 policy trained by marl keeps fp32 master weights."""
    version: int = 0
    """Counts the changes of the weights (``mark_updated``): a rollout backend holding its own copy syncs
    when it differs from the version it last received."""
    base: str | None = None
    """An adapter's frozen base model, by name (``lora_base``, ``lora_base_<policy>``); None for a full model."""

    def mark_updated(self) -> None:
        """The weights changed (an optimiser step, a warm start, a load): backends with their own copy re-sync."""
        self.version += 1

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The mixed-precision compute dtype when the weights are kept in higher precision (fp32 masters), else None."""
        return self.compute_dtype if self.compute_dtype != next(self.model.parameters()).dtype else None

    def activate(self) -> None:
        """Route the shared base's forward pass through this policy's adapter (no-op for full models)."""
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)

    @contextlib.contextmanager
    def reference(self) -> Iterator[PreTrainedModel]:
        """The model without this policy's adapter (the frozen base); full models have no such view."""
        if self.adapter is None:
            raise ValueError(f"policy {self.name!r} has no adapter")
        with self.model.disable_adapter():
            yield self.model

    def load_weights(self, path: Path) -> None:
        """Copy the full-model weights saved at ``path`` into this policy's model, in place."""
        if self.adapter is not None:
            raise ValueError(f"policy {self.name!r} is an adapter; load_weights takes full models")
        saved = type(self.model).from_pretrained(path, dtype=self.model.dtype)
        self.model.load_state_dict(saved.state_dict())
        self.mark_updated()

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What an update changes: a full model's state dict, or this adapter's weights only (views, not copies)."""
        if self.adapter is None:
            return self.model.state_dict()
        return get_peft_model_state_dict(self.model, adapter_name=self.adapter)

    def load_trained_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load what ``trained_state`` gave (another process's copy of this policy), in place."""
        if self.adapter is None:
            self.model.load_state_dict(state)
        else:
            set_peft_model_state_dict(self.model, state, adapter_name=self.adapter)
        self.mark_updated()

    def save(self, path: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Full models: HF weights (``weights`` instead of the model's own when given); adapters: this adapter's
        weights and config only."""
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        if self.adapter is None:
            self.model.save_pretrained(path, state_dict=weights)
            return
        self.model.peft_config[self.adapter].save_pretrained(path)
        save_file(get_peft_model_state_dict(self.model, adapter_name=self.adapter), str(path / _ADAPTER_FILE))


@dataclass(frozen=True)
class Placement:
    """Where each policy's model lives: ``by_policy[name]`` (``policy.devices``), else ``default``."""

    default: torch.device
    by_policy: dict[str, torch.device] = field(default_factory=dict)

    def of(self, name: str) -> torch.device:
        return self.by_policy.get(name, self.default)


def build_policies(role_map: dict[str, str], model_cfg: Any, seed: int, workdir: Path,
                   device: torch.device | Placement, sources: dict[str, str] | None = None,
                   regime: str = "shared", master_weights: bool = False,
                   models: dict[str, Any] | None = None) -> dict[str, Policy]:
    """Load one model per policy name, on ``device`` (or its ``Placement``); ``sources`` (e.g. a checkpoint)
    override where each loads from.

    Each policy starts from ``model_cfg``, or from its own entry of ``models`` (a team of different models,
    ``config.team.policy_model``: its own tiny model is saved under ``workdir/tiny_init_<name>``, its own dtype).
    Under ``lora_per_role`` this returns the base models instead (``roles.lora_bases``: ``lora_base`` and one
    ``lora_base_<policy>`` per other model config), each serving its policies' roles (what the warm start trains);
    ``attach_all_adapters`` then splits each into its policies' adapters.
    ``master_weights`` (training): a bf16/fp16 ``model.dtype`` loads fp32 weights and computes in that
    dtype (mixed precision), so small updates are not rounded away.
    """
    models = models or {}
    if REGIMES.get(regime).adapters:
        role_map, models = _as_bases(role_map, model_cfg, models)
    policies: dict[str, Policy] = {}
    place = device if isinstance(device, Placement) else Placement(device)
    for role, name in role_map.items():
        if name not in policies:
            own = models.get(name, model_cfg)
            source = (sources or {}).get(name) or resolve_source(own, seed, workdir,
                                                                 "" if own is model_cfg else f"_{name}")
            compute = DTYPES.get(own.dtype)
            stored = "float32" if master_weights and compute is not None else own.dtype
            policies[name] = Policy(name, load_model(source, stored, place.of(name)), load_tokenizer(source), source,
                                    compute_dtype=compute)
        policies[name].roles.append(role)
    return policies


def _as_bases(role_map: dict[str, str], model_cfg: Any, models: dict[str, Any]) -> tuple[dict[str, str],
                                                                                         dict[str, Any]]:
    """An adapter regime's role → base map, and the model config of each base not of ``model_cfg``."""
    bases = lora_bases(role_map, model_cfg, models)
    return ({role: bases[name] for role, name in role_map.items()},
            {bases[name]: own for name, own in models.items() if name in bases and bases[name] != LORA_BASE})


def _lora_config(policy_cfg: Any) -> LoraConfig:
    """peft's ``LoraConfig`` for ``policy.lora_*``."""
    if policy_cfg.lora_r < 1:
        raise ConfigError(f"policy.lora_r must be at least 1, got {policy_cfg.lora_r}")
    targets = policy_cfg.lora_target_modules
    return LoraConfig(r=policy_cfg.lora_r, lora_alpha=policy_cfg.lora_alpha, lora_dropout=policy_cfg.lora_dropout,
                      target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",")],
                      task_type="CAUSAL_LM")


def attach_adapters(base: Policy, role_map: dict[str, str], policy_cfg: Any, workdir: Path,
                    adapters: dict[str, str] | None = None, seed: int = 0) -> dict[str, Policy]:
    """Freeze ``base`` (saved once under ``workdir/<base name>``) and give each policy that its roles (``base.roles``)
    act through in ``role_map`` a LoRA adapter on it.

    The adapters' initial weights are drawn from ``seed`` alone (torch's generators are left as they were), so they
    do not depend on what ran before: a warm start, or its reuse from the cache. ``adapters`` maps policy names to
    checkpoint dirs whose adapter weights are loaded (resume); those of policies of other bases are left to theirs.
    """
    lora = _lora_config(policy_cfg)
    role_map = {role: role_map[role] for role in base.roles}
    base_dir = workdir / base.name
    save_once(base_dir, lambda path: (base.model.save_pretrained(path), base.tokenizer.save_pretrained(path)))
    names = list(dict.fromkeys(role_map.values()))
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(seed)
        model: PeftModel = get_peft_model(base.model, lora, adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, lora)
    for name, path in (adapters or {}).items():
        if name in names:
            try:
                set_peft_model_state_dict(model, load_file(str(Path(path) / _ADAPTER_FILE)), adapter_name=name)
            except RuntimeError as exc:  # a size mismatch: the adapter was trained on another model
                raise ConfigError(f"the adapter in {path} does not fit the base {base.name} ({base.source}): the "
                                  "run's model or policy.models differ from this config's") from exc
    policies = {name: Policy(name, model, base.tokenizer, str(base_dir), adapter=name,
                             compute_dtype=base.compute_dtype, base=base.name) for name in names}
    for role, name in role_map.items():
        policies[name].roles.append(role)
    return policies


def attach_all_adapters(bases: dict[str, Policy], role_map: dict[str, str], policy_cfg: Any, workdir: Path,
                        adapters: dict[str, str] | None = None, seed: int = 0) -> dict[str, Policy]:
    """``attach_adapters`` on every base of ``bases`` (``build_policies`` under an adapter regime): every policy of
    ``role_map`` as an adapter on the base of its roles, by name."""
    return {name: policy for base in bases.values()
            for name, policy in attach_adapters(base, role_map, policy_cfg, workdir, adapters, seed).items()}


def routing(role_map: dict[str, str], policies: dict[str, Policy]) -> dict[str, str]:
    """Role → the policy that acts for it now: the one of ``policies`` serving it (an adapter regime's base until
    the adapters attach: the warm-start phase and its evals), else its own policy in ``role_map``."""
    acting = {role: name for name, policy in policies.items() for role in policy.roles}
    return {role: acting.get(role, name) for role, name in role_map.items()}


def base_dirs(cfg: Any, role_map: dict[str, str], run_dir: Path) -> dict[str, str]:
    """Where an adapter regime's run keeps each base its policies of ``role_map`` sit on: ``<run_dir>/<base>``."""
    bases = lora_bases(role_map, cfg.model, policy_models(cfg))
    return {base: str(run_dir / base) for base in dict.fromkeys(bases.values())}


def saved_policies(checkpoint: Path) -> dict[str, Path]:
    """The policies a checkpoint holds, by name."""
    return {p.name: p for p in sorted((checkpoint / "policies").iterdir()) if p.is_dir()}


def policy_dirs(checkpoint: Path, names: set[str]) -> dict[str, str]:
    """Where ``checkpoint`` keeps each named policy (``<checkpoint>/policies/<name>``)."""
    return {name: str(checkpoint / "policies" / name) for name in names}


def resume_sources(cfg: Any, run_dir: Path, checkpoint: Path, role_map: dict[str, str]) -> dict[str, str]:
    """Where a resumed run's policies (those of ``role_map``) load from: each full model from ``checkpoint``; an
    adapter regime's bases from the run's ``lora_base/`` (and ``lora_base_<policy>/``, ``base_dirs``; the adapters
    load when they attach, ``checkpoint_adapters``)."""
    if uses_adapters(cfg.policy):
        return base_dirs(cfg, role_map, run_dir)
    return policy_dirs(checkpoint, set(role_map.values()))


def checkpoint_adapters(checkpoint: Path | None, names: set[str]) -> dict[str, str] | None:
    """The adapter dirs a resumed adapter regime loads, by policy name (None: a fresh run)."""
    return None if checkpoint is None else policy_dirs(checkpoint, names)


def load_checkpoint(cfg: Any, role_map: dict[str, str], run_dir: Path, checkpoint: Path,
                    device: torch.device | Placement, workdir: Path) -> dict[str, Policy]:
    """The policies saved in ``checkpoint`` of ``run_dir``, for ``role_map`` (evaluation): each by its
    name, or every one from a checkpoint's only policy. Adapter checkpoints load onto the run's saved
    bases (``load_adapters``) and need an adapter regime; full models need a full-model regime."""
    saved = saved_policies(checkpoint)
    adapters = {n for n, p in saved.items() if not (p / "config.json").exists()}
    wanted = set(role_map.values())
    adapter_regime = uses_adapters(cfg.policy)
    if adapters:
        if not adapter_regime:
            raise ConfigError(f"load={checkpoint} holds LoRA adapters ({', '.join(sorted(adapters))}); "
                              "evaluate it with policy=lora_per_role (and the run's policy.lora_* settings)")
        return load_adapters(cfg, role_map, run_dir, checkpoint, device, workdir)
    if adapter_regime:
        raise ConfigError(f"load={checkpoint} holds full models; evaluate it with policy=shared or policy=per_role")
    if len(saved) == 1:
        sources = dict.fromkeys(wanted, str(next(iter(saved.values()))))
    else:
        missing = sorted(wanted - set(saved))
        if missing:
            raise ConfigError(f"load={checkpoint}: no saved model for policies {missing}; it has {sorted(saved)} "
                              "(map roles to them with +policy.assignment.<role>=<policy>)")
        sources = {n: str(saved[n]) for n in wanted}
    return build_policies(role_map, cfg.model, cfg.seed, workdir, device, sources, cfg.policy.name,
                          models=policy_models(cfg))


def load_adapters(cfg: Any, role_map: dict[str, str], run_dir: Path, checkpoint: Path,
                  device: torch.device | Placement, workdir: Path) -> dict[str, Policy]:
    """The adapters saved in ``checkpoint``, for ``role_map``, each on the base of ``run_dir`` its model config names
    (``base_dirs``): a base the config names that the run lacks, or, when every saved adapter is wanted, one the run
    saved that the config does not name (the run's ``policy.models`` left out), is a one-line error."""
    saved = saved_policies(checkpoint)
    wanted = set(role_map.values())
    missing = sorted(wanted - set(saved))
    if missing:
        raise ConfigError(f"load={checkpoint}: no adapter for policies {missing}; it has {sorted(saved)}")
    sources = base_dirs(cfg, role_map, run_dir)
    kept = sorted(p.name for p in run_dir.iterdir()
                  if p.is_dir() and (p.name == LORA_BASE or p.name.startswith(f"{LORA_BASE}_")))
    unsaved = sorted(set(sources) - set(kept))
    unused = sorted(set(kept) - set(sources)) if wanted == set(saved) else []
    if unsaved or unused:
        raise ConfigError(f"load={checkpoint}: the run saved the bases {kept}, this config's policies sit on "
                          f"{sorted(sources)}; evaluate with the run's policy.models")
    bases = build_policies(role_map, cfg.model, cfg.seed, workdir, device, sources, cfg.policy.name,
                           models=policy_models(cfg))
    return attach_all_adapters(bases, role_map, cfg.policy, workdir, {n: str(saved[n]) for n in wanted}, cfg.seed)
