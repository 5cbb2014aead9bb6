"""Validate a config completely before a run starts, and explain every failure in one line.

Hydra reports composition errors over several lines with exit code 1. ``check_overrides`` composes
every value of every sweep once (each alone, the other sweeps at their first value) and runs
``check_config`` on it, raising a ``ConfigError`` naming the key and, where there is a list, the valid
choices. ``check_config`` holds every rule of a run config that needs no model: keys no schema
declares, field ranges (``schema.bounded``), names of registered plug-ins, the rules each plug-in carries
(its registry's ``check`` and its own, run for whichever plug-in of each kind the config selects) and the
rules across the core groups. It imports no plug-in (load them first: ``marl_cli.plugins``). It runs in the
``marl`` process before Hydra makes a run dir, and again at the start of every job.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from marl_cli.config.errors import ConfigError
from marl_cli.config.launch import launched_world_size
from marl_cli.config.paths import config_dir
from marl_cli.config.registry import Registry, registries
from marl_cli.config.schema import CLIPPED_LOSSES
from marl_cli.config.team import check_role_sampling, check_schema, policy_trainer

DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Plain override lists covering every value of every sweep (``k=a,b``, ``range(...)``) at least once."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices: list[list[str]] = []
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # interval sweeps (optuna) have no finite list; their key is still checked
                values = [override.get_value_element_as_str().split("(")[-1].split(",")[0].strip(" )")]
            choices.append([f"{key}={v}" for v in values] or [override.input_line])
        else:
            choices.append([override.input_line])
    first = [c[0] for c in choices]
    variants = [first]
    for i, options in enumerate(choices):
        for option in options[1:]:
            variants.append([*first[:i], option, *first[i + 1:]])
    return variants


def _keys_of(object_type: object) -> list[str]:
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [f.name for f in dataclasses.fields(object_type)]
    return []


def owners(full_key: str, object_type: object) -> str:
    """For a key the selected plug-in's schema lacks but another plug-in of its group reads (``algorithm.filter``
    under ``algorithm=ppo``): one line naming the plug-ins that read it and the keys this one has; else empty."""
    group, _, key = full_key.partition(".")
    for registry in registries():
        if registry.group != group or "." in key:
            continue
        mine = [name for name, schema in registry.schemas.items() if schema is object_type]
        others = [name for name, schema in sorted(registry.schemas.items()) if key in _keys_of(schema)]
        if mine and others:
            return (f"{full_key} is a setting of {', '.join(f'{group}={o}' for o in others)}, not of {group}={mine[0]} "
                    f"(its keys: {', '.join(k for k in _keys_of(object_type) if k != 'name')})")
    return ""


MOVED = {"rollout.eval_temperature": "eval.temperature",
         **{f"trainer.epo_{key}": f"loss=epo with loss.{key}" for key in ("coef", "penalty", "decay", "window")},
         **{f"trainer.epo_corridor_{side}": f"loss=epo with loss.corridor_{side}" for side in ("low", "high")},
         "trainer.sync": "trainer.max_staleness (sync=true is 0; sync=false let the sub policy's weights lag: "
                         "give the lag it may have, e.g. 1)"}
"""Keys that moved: the error for the old one names the new one."""


def describe(exc: BaseException) -> str:
    """One line saying what is wrong with the config and what would be valid."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, MissingConfigException):
            return missing_option(err)
    for err in chain:
        if isinstance(err, OmegaConfBaseException) and getattr(err, "full_key", None):
            if isinstance(err, ConfigKeyError | ConfigAttributeError):
                valid = _keys_of(getattr(err, "object_type", None))
                hint = f"; valid keys: {', '.join(valid)}" if valid else ""
                if err.full_key in MOVED:
                    hint = f"; it is {MOVED[err.full_key]} now"
                elsewhere = owners(err.full_key, getattr(err, "object_type", None))
                if elsewhere:
                    return elsewhere
                return f"{err.full_key}: no such key{hint}"
            return f"{err.full_key}: {err.msg.splitlines()[0].split('raised while resolving interpolation: ')[-1]}"
    return " ".join(str(exc).replace("\t", " ").split())


PLUGIN_HINT = ("name the plug-in's module or .py file in MARL_PLUGINS (comma-separated) or in the marl.plugins "
               "entry-point group")
PLUGIN_GROUPS = ("env", "workflow", "algorithm", "credit", "critic", "loss", "policy", "rollout", "reward")
"""The groups a plug-in adds options to (with its schema, ``<group>/base_<name>``), in the order their
plug-ins are checked (a reward model last: its check may ask a server)."""


def _group_and_choice(path: str) -> tuple[str, str]:
    """``env/plan_pth`` -> (``env``, ``plan_pth``); ``experiment/toy/x`` -> (``experiment``, ``toy/x``);
    ``hydra/launcher/x`` -> (``hydra/launcher``, ``x``)."""
    parts = path.split("/")
    cut = 2 if parts[0] == "hydra" else 1
    return "/".join(parts[:cut]), "/".join(parts[cut:])


def _options(err: MissingConfigException, group: str, choice: str) -> list[str]:
    """What there is where ``choice`` was looked for: the group's options, or a nested folder's entries."""
    folder = choice.rpartition("/")[0]
    where = config_dir() / group / folder
    if not folder and not any(where.glob("*/")):
        return [o for o in (err.options or []) if not o.startswith("base_")]
    entries = [f"{p.stem}" for p in where.glob("*.yaml")] + [f"{p.name}/" for p in where.glob("*/")]
    return sorted(f"{folder}/{e}" if folder else e for e in entries if not e.startswith("base_"))


def missing_option(err: MissingConfigException) -> str:
    """One line for a config option Hydra cannot find: ``env=plan_pth`` (naming the options there), or a plug-in's
    option whose schema (``env/base_reverse``) no loaded plug-in registers (naming what to load)."""
    text = str(err)
    missing = re.search(r"Could not (?:find|load) '([^']+)'", text)
    path = str(missing.group(1) if missing else err.missing_cfg_file)
    if "/" not in path:
        return text.split("\n")[0]
    group, choice = _group_and_choice(path)
    if choice.startswith("base_"):
        parent = re.search(r"In '([^']+)'", text)
        option = "=".join(_group_and_choice(parent.group(1))) if parent else f"{group}={choice[5:]}"
        return (f"{option}: the schema {group}/{choice} is not registered, so the plug-in that defines {group} "
                f"{choice[5:]!r} is not loaded; {PLUGIN_HINT}")
    options = _options(err, group, choice)
    listed = f"; choose from: {', '.join(options)}" if options else ""
    plugin = (f" (a plug-in's {group}? add its config dir with --config-dir and its module with MARL_PLUGINS)"
              if group in PLUGIN_GROUPS else "")
    return f"{group}={choice}: no such option{listed}{plugin}"


def check_device(name: str, where: str = "") -> None:
    """That this machine has ``device=<name>`` (mps, cuda, cuda:<index>), checked before any model is built; torch
    is imported only for such a device (auto and cpu need no check, and config checks stay fast without it)."""
    if name in ("auto", "cpu"):
        return
    import torch

    fix = "use device=cpu or device=auto"
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{where}device='mps' but this machine has no MPS (Apple GPU) device; {fix}")
    if not name.startswith("cuda"):
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        build = "" if torch.version.cuda else f" (torch {torch.__version__} is a CPU-only build)"
        raise ConfigError(f"{where}device={name!r} but no CUDA device is visible{build}; {fix}")
    index = int(name.partition(":")[2] or 0)
    if index >= count:
        raise ConfigError(f"{where}device={name!r} but this machine has {count} CUDA device(s), cuda:0 to "
                          f"cuda:{count - 1} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")


def _check_devices(cfg: DictConfig) -> None:
    """Every device's name, then whether this machine has it."""
    named = [("device", cfg.device), *(("policy.devices", d) for d in cfg.policy.devices)]
    for key, device in named:
        if not DEVICE.fullmatch(device):
            raise ConfigError(f"{key}: {device!r} is not a device; choose from auto, cpu, mps, cuda, cuda:<index>")
    for key, device in named:
        check_device(device, "" if key == "device" else f"{key}: ")


def plugin_registries() -> list[Registry[Any]]:
    """The registry of every plug-in group, in ``PLUGIN_GROUPS`` order; an error if a group's plug-ins are not
    loaded (``marl_cli.plugins.load_all`` loads them; this layer imports none)."""
    by_group = {r.group: r for r in registries() if r.group}
    missing = [g for g in PLUGIN_GROUPS if g not in by_group]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)} plug-ins are loaded: call marl_cli.plugins.register_configs() "
                           "(or load_all()) before checking a config")
    return [by_group[g] for g in PLUGIN_GROUPS] + [r for g, r in by_group.items() if g not in PLUGIN_GROUPS]


def check_plugins(cfg: DictConfig) -> None:
    """Every selected plug-in is registered (one line naming the choices if not), then each kind's and each
    selected plug-in's own check (the rules a plug-in carries: a backend's requirements, a regime's, ...)."""
    kinds = plugin_registries()
    for registry in kinds:
        registry.selected(cfg)
    for registry in kinds:
        registry.check_selected(cfg)


def check_run(cfg: DictConfig) -> None:
    """The rules across groups: the plug-ins' (``check_plugins``), devices, roles, what a run loads, processes."""
    check_plugins(cfg)
    _check_devices(cfg)
    source = cfg.model.name_or_path
    local = source and (source.startswith(("/", ".", "~")) or source.count("/") > 1)  # hub ids: name, org/name
    if local and not Path(source).expanduser().exists():
        raise ConfigError(f"model.name_or_path={source}: no such directory (a hub id looks like org/name)")
    roles = list(cfg.workflow.roles)
    for key in ("trainer.frozen_roles", "model.system_prompts", "rollout.roles", "eval.roles"):
        unknown = sorted(set(OmegaConf.select(cfg, key)) - set(roles))
        if unknown:
            raise ConfigError(f"{key} names roles {unknown} that the workflow lacks; roles: {roles}")
    for key in ("trainer.resume", "trainer.init_from"):
        where = OmegaConf.select(cfg, key)
        if where and not Path(where).is_dir():
            raise ConfigError(f"{key}={where}: no such directory")
    if OmegaConf.select(cfg, "trainer.resume"):
        check_resume(cfg, Path(cfg.trainer.resume).resolve())
    _check_eval(cfg)
    check_role_sampling(cfg)
    check_loss(cfg.trainer)
    for name in cfg.policy.trainers:
        check_loss(policy_trainer(cfg, name), f"policy.trainers.{name}")
    _check_processes(cfg, launched_world_size())


TOKEN_SUM_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")
"""The loss types that sum token terms over the batch: at the sequence level each sequence's ratio would weigh as
many times as it has tokens (TRL warns; GSPO's objective is a mean per sequence)."""


def check_loss(trainer: Any, where: str = "trainer") -> None:
    """The rules across the loss keys of ``trainer`` (the run's, or a policy's merged, named by ``where``): the
    combinations TRL's constructor only warns of, and a knob the loss type would ignore."""
    loss, level, delta = trainer.loss_type, trainer.importance_sampling_level, trainer.delta
    if level == "sequence" and loss in TOKEN_SUM_LOSSES:
        raise ConfigError(f"{where}.importance_sampling_level=sequence with {where}.loss_type={loss}: a token-sum loss "
                          "weights each sequence's ratio by its length, not GSPO's per-sequence objective; "
                          "use loss_type=grpo (or luspo)")
    if loss == "luspo" and level != "sequence":
        raise ConfigError(f"{where}.loss_type=luspo is a sequence-level loss: set "
                          f"{where}.importance_sampling_level=sequence")
    if loss == "vespo" and level != "token":
        raise ConfigError(f"{where}.loss_type=vespo weights whole sequences itself: keep "
                          f"{where}.importance_sampling_level=token")
    if delta is not None and loss not in CLIPPED_LOSSES:
        raise ConfigError(f"{where}.delta={delta}: loss_type={loss} does not clip the ratio; the two-sided clip is for "
                          f"{', '.join(CLIPPED_LOSSES)}")
    high = trainer.epsilon if trainer.epsilon_high is None else trainer.epsilon_high
    if delta is not None and delta <= 1 + high:
        raise ConfigError(f"{where}.delta={delta} must exceed 1 + epsilon_high = {1 + high:g}: the two-sided clip "
                          "caps the ratios the PPO clip leaves unbounded (negative advantages)")
    if trainer.entropy_coef_min > trainer.entropy_coef_max:
        raise ConfigError(f"{where}.entropy_coef_min={trainer.entropy_coef_min} exceeds "
                          f"{where}.entropy_coef_max={trainer.entropy_coef_max}")


def _check_processes(cfg: DictConfig, processes: int) -> None:
    """What a run launched as several processes (torchrun / accelerate launch) needs."""
    for variable, plugin in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "").lower() == "true":
            raise ConfigError(f"accelerate's {plugin} plugin would wrap marl's models behind its back; launch with a "
                              "plain multi-process config (examples/accelerate/multi_gpu.yaml) and shard the "
                              "learners with trainer.sharding=fsdp2")
    if processes == 1:
        return
    where = f"launched as {processes} processes"
    if "load" in cfg:
        raise ConfigError(f"marl eval runs in one process ({where}); start it with plain `marl eval`")
    if cfg.trainer.role != "all":
        raise ConfigError(f"trainer.role={cfg.trainer.role}: decoupled trainers run one process each ({where})")
    if cfg.policy.devices:
        raise ConfigError(f"policy.devices places policies within one process; {where}, each uses its own GPU")
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm.tensor_parallel_size > 1:
        raise ConfigError(f"rollout.vllm.tensor_parallel_size={cfg.rollout.vllm.tensor_parallel_size}: {where}, each "
                          "process runs its own engine on its own GPU (tensor parallelism needs one process)")
    for key, value in (("rollout.tasks_per_step", cfg.rollout.tasks_per_step),
                       ("trainer.mini_batch_size", cfg.trainer.mini_batch_size)):
        if value < processes:
            raise ConfigError(f"{key}={value} gives some of the {processes} processes nothing to do; "
                              f"set it to at least {processes}")
    if cfg.trainer.warmstart.enabled and cfg.trainer.warmstart.batch_size % processes:
        raise ConfigError(f"trainer.warmstart.batch_size={cfg.trainer.warmstart.batch_size} must be a multiple "
                          f"of the {processes} processes (each trains an equal share of every batch)")


def _check_eval(cfg: DictConfig) -> None:
    samples = cfg.eval.samples
    if cfg.eval.temperature == 0 and samples > 1:
        raise ConfigError(f"eval.samples={samples} with eval.temperature=0 repeats one greedy episode; "
                          "set eval.temperature>0 to sample")
    bad = [k for k in cfg.eval.pass_k if not 1 <= k <= samples]
    if bad:
        raise ConfigError(f"eval.pass_k={list(cfg.eval.pass_k)}: every k must be between 1 and eval.samples={samples}")
    load = OmegaConf.select(cfg, "load")
    if load and not Path(load).exists():
        raise ConfigError(f"load={load}: no such run or checkpoint directory")


def check_config(cfg: DictConfig) -> None:
    """Every rule a composed run config must satisfy, checked before a run dir, a model or TRL is touched."""
    check_schema(cfg)
    check_run(cfg)


def check_overrides(config_name: str, overrides: list[str], search_dirs: list[str] = (), full: bool = True) -> None:
    """Compose ``config_name`` with ``overrides`` (and each sweep value) and check it; raise ConfigError on failure.

    ``search_dirs`` are the user's config dirs (``--config-dir``), searched as Hydra's app searches them.
    ``full=False`` only composes (``--cfg job`` shows a config that composes, even one a run would refuse).
    """
    if search_dirs:
        paths = ",".join(f"file://{d}" for d in search_dirs)
        overrides = [*overrides, f"hydra.searchpath=[{paths}]"]
    try:
        variants = sweep_variants(overrides)
    except Exception as exc:
        raise ConfigError(describe(exc)) from exc
    for variant in variants:
        try:
            with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
                cfg = compose(config_name=config_name, overrides=variant)
            if full and config_name != "report":
                check_config(cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(describe(exc)) from exc


IDENTITY = ("model", "env", "workflow", "algorithm", "credit", "critic", "policy", "seed")
"""What a run is: a resume may change anything else (steps, logging, learning rate, ...), not these."""
AS_BEFORE = {"algorithm.turn_credit": "immediate", "algorithm.gamma": 1.0, "algorithm.norm_group": "turn",
             "credit": {"name": "none"}, "critic": {"name": "none"}}
"""Keys a later marl added to ``IDENTITY``'s groups, with the value that does what runs did before they existed."""
UNREAD = ("algorithm",)
"""Groups whose schema once held keys their plug-in never read (one flat algorithm schema for every algorithm): a
saved key this config's schema lacks was not read by the run, so it changes nothing."""


def _differences(saved: Any, now: Any, path: str) -> Iterator[str]:
    """The keys under ``path`` whose value differs; a key the saved config lacks (one a later marl added) is
    unchanged while it is left empty or as ``AS_BEFORE`` has it; a key only the saved config has is unchanged under
    ``UNREAD``'s groups."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for key in sorted(set(saved) | set(now)):
            if key not in now and path in UNREAD:
                continue
            if key not in saved and (now[key] in (None, {}, []) or AS_BEFORE.get(f"{path}.{key}") == now[key]):
                continue
            yield from _differences(saved.get(key), now.get(key), f"{path}.{key}")
    elif saved is None and AS_BEFORE.get(path) == now:
        return
    elif saved != now:
        yield f"{path} ({saved!r} -> {now!r})"


def check_resume(cfg: DictConfig, run_dir: Path) -> None:
    """A resumed run keeps what it is: refuse (one line, naming the keys) a config whose model, env (but its
    eval size), workflow, algorithm, credit, policy, seed or ``trainer.sharding`` (the layout of its optimiser state)
    differ from the run's saved ``.hydra/config.yaml``."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.exists():
        return
    saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    now = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)  # choices as the saved yaml writes them
    changed = [d for key in IDENTITY for d in _differences(saved.get(key), now.get(key), key)
               if not d.startswith("env.eval_size ")]
    changed += _differences(saved.get("trainer", {}).get("sharding", "none"), str(cfg.trainer.sharding),
                            "trainer.sharding")
    if changed:
        raise ConfigError(f"trainer.resume={run_dir}: the run was trained with other settings; changed: "
                          f"{', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''} (drop these overrides, "
                          "or start a new run with trainer.init_from=<checkpoint>)")
