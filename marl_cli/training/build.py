"""One assembly for every marl app (train, eval, bench, tests): ``build_run`` turns a checked config into
the role→policy map (computed once here), where the policies load from (``PolicySource``) and the ``Rollout`` (the
team over its env, the policies, the rollout backend and the sampling every rollout and the learner use)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from marl_cli import determinism
from marl_cli.config.errors import ConfigError
from marl_cli.config.team import policy_models, role_sampling
from marl_cli.config.validate import check_config, check_device
from marl_cli.core.staleness import Staleness
from marl_cli.core.world import World
from marl_cli.credit import CREDITS
from marl_cli.envs import ENVS, build_env
from marl_cli.policies.regime import (
    Placement,
    Policy,
    attach_all_adapters,
    build_policies,
    load_checkpoint,
    policy_dirs,
    resume_sources,
    routing,
)
from marl_cli.policies.roles import role_map as run_role_map
from marl_cli.policies.roles import sub_roles, uses_adapters
from marl_cli.policies.scripted import NoTokens, is_scripted, scripted_routing
from marl_cli.rollout.backends import BACKENDS
from marl_cli.rollout.backends.base import Generator
from marl_cli.rollout.engine import Rollout, RolloutResult
from marl_cli.rollout.generation import Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.training.checkpoint import latest_checkpoint
from marl_cli.training.rows.distributed import play_shared
from marl_cli.workflows import WORKFLOWS, build_workflow
from marl_cli.workflows.base import Workflow


def resolve_device(name: str) -> torch.device:
    """``device=auto|cpu|mps|cuda[:N]`` as a torch device; a one-line error when this machine lacks it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(name)
    return torch.device(name)


def placement(cfg: DictConfig, role_map: dict[str, str]) -> Placement:
    """The run's ``device``, with ``policy.devices`` each full-model policy on the next device in turn (in the
    order the workflow's roles first name them), e.g. the two per-role policies on ``cuda:0`` and ``cuda:1``."""
    default = resolve_device(cfg.device)
    devices = [resolve_device(d) for d in cfg.policy.devices]
    names = list(dict.fromkeys(role_map.values()))
    return Placement(default, {n: devices[i % len(devices)] for i, n in enumerate(names)} if devices else {})


def sampling_from(cfg: DictConfig, evaluation: bool = False) -> Sampling:
    """How the run's training rollouts sample (``rollout.*``, each role with ``rollout.roles.<role>``), or with
    ``evaluation`` its evaluations (the same at ``eval.temperature``, 0: greedy, then ``eval.roles.<role>``)."""
    rollout, model_cfg = cfg.rollout, cfg.model
    return Sampling(temperature=cfg.eval.temperature if evaluation else rollout.temperature, top_p=rollout.top_p,
                    top_k=rollout.top_k, min_p=rollout.min_p, max_new_tokens=rollout.max_new_tokens,
                    stop=tuple(rollout.stop), max_prompt_length=rollout.max_prompt_length,
                    batch_size=rollout.batch_size, cache=str(rollout.hf.cache),
                    width_multiple=rollout.hf.width_multiple,
                    use_chat_template=model_cfg.use_chat_template,
                    system_prompts=dict(model_cfg.system_prompts),
                    chat_template_kwargs=OmegaConf.to_container(model_cfg.chat_template_kwargs),
                    roles={role: role_sampling(cfg, role, evaluation) for role in cfg.workflow.roles})


def init_seed(cfg: DictConfig) -> int:
    """The seed the policies' initial weights come from: ``trainer.warmstart.seed`` when a pinned warm start
    trains them, else the run seed."""
    ws = cfg.trainer.warmstart
    return ws.seed if ws.enabled and ws.seed is not None else cfg.seed


def build_team(cfg: DictConfig, seed: int | None = None, sandbox: Sandbox | None = None) -> Workflow:
    """The workflow over its environment seeded by ``seed`` (default: the run seed), with ``sandbox`` (default:
    a new one when either executes model-written code)."""
    runs_code = ENVS.get(cfg.env.name).uses_sandbox(cfg.env) or WORKFLOWS.get(cfg.workflow.name).runs_code
    if sandbox is None and runs_code:
        sandbox = Sandbox(cfg.sandbox)
    return build_workflow(cfg.workflow, build_env(cfg.env, cfg.seed if seed is None else seed, sandbox))


def resolve_load(load: str) -> tuple[Path, Path]:
    """The run dir and checkpoint dir that ``load`` (a run dir or ``<run>/checkpoints/step_N``) names."""
    path = Path(load).expanduser().resolve()
    if (path / "state.pt").exists() and path.parent.name == "checkpoints":
        return path.parents[1], path
    if not path.exists():
        raise ConfigError(f"load={load}: no such run or checkpoint directory")
    try:
        return path, latest_checkpoint(path)
    except ConfigError as exc:
        raise ConfigError(f"load={load}: not a checkpoint (<run>/checkpoints/step_N) nor a run dir with one") from exc


def initial_policies(checkpoint: Path, names: set[str]) -> dict[str, str]:
    """Where each policy starts under ``trainer.init_from``: ``<checkpoint>/policies/<name>`` (full models)."""
    missing = sorted(n for n in names if not (checkpoint / "policies" / n / "config.json").exists())
    if missing:
        raise ConfigError(f"trainer.init_from={checkpoint}: no saved model for policies {missing} under "
                          f"{checkpoint / 'policies'}")
    return policy_dirs(checkpoint, names)


@dataclass(frozen=True)
class PolicySource:
    """Where a run's policies load from, read once from the config (``of``) by ``build_run``.

    Args:
        checkpoint: the checkpoint a resumed training run continues from (``trainer.resume``), or the one
            ``marl eval`` loads (``load=``); None: a fresh start.
        loaded_run: ``marl eval load=``: the run dir ``checkpoint`` belongs to.
        init_from: ``trainer.init_from``: the checkpoint a fresh training run's full models start from.
        evaluating: ``marl eval`` (no fp32 master weights; the run seed builds the model as configured).
    """

    checkpoint: Path | None = None
    loaded_run: Path | None = None
    init_from: Path | None = None
    evaluating: bool = False

    @classmethod
    def of(cls, cfg: DictConfig) -> PolicySource:
        if "load" in cfg:  # the marl eval app
            if not cfg.load:
                return cls(evaluating=True)
            loaded_run, checkpoint = resolve_load(cfg.load)
            return cls(checkpoint, loaded_run, evaluating=True)
        resume = OmegaConf.select(cfg, "trainer.resume")
        checkpoint = latest_checkpoint(Path(resume).resolve()) if resume else None
        init_from = OmegaConf.select(cfg, "trainer.init_from")
        return cls(checkpoint, init_from=Path(init_from) if init_from else None)

    @property
    def resumed(self) -> Path | None:
        """The checkpoint a resumed training run continues from (None: a fresh run, or an evaluation)."""
        return None if self.evaluating else self.checkpoint

    def load(self, cfg: DictConfig, run_dir: Path, owned: dict[str, str], device: Placement) -> dict[str, Policy]:
        """The policies of the roles in ``owned`` (role → policy), placed on ``device``."""
        if self.evaluating and self.checkpoint is not None:
            return load_checkpoint(cfg, owned, self.loaded_run, self.checkpoint, device, run_dir)
        if self.evaluating:
            return build_policies(owned, cfg.model, cfg.seed, run_dir, device, None, cfg.policy.name,
                                  models=policy_models(cfg))
        names = set(owned.values())
        sources = None
        if self.checkpoint is not None:
            sources = resume_sources(cfg, run_dir, self.checkpoint, owned)
        elif self.init_from is not None:
            sources = initial_policies(self.init_from, names)
        return build_policies(owned, cfg.model, init_seed(cfg), run_dir, device, sources, cfg.policy.name,
                              master_weights=True, models=policy_models(cfg))


@dataclass
class Run:
    """What a run acts with.

    Args:
        cfg: the checked run config.
        run_dir: where the run writes (the tiny model's initial weights too).
        role_map: role → the policy it acts through (computed once per run, by ``build_run``); a scripted role
            (``policy.scripted``) has none, and is routed to its actor (``scripted:<actor>``) only.
        rollout: the team, the policies as routed now, the generation backend and the sampling settings.
        source: where the policies were loaded from.
        world: the processes training the run together (``core/world.py``).
        staleness: how many updates its rows may trail the learner (``trainer.max_staleness``, ``core/staleness.py``).
    """

    cfg: DictConfig
    run_dir: Path
    role_map: dict[str, str]
    rollout: Rollout
    source: PolicySource = field(default_factory=PolicySource)
    world: World = field(default_factory=World)
    staleness: Staleness = field(default_factory=Staleness)

    @property
    def workflow(self) -> Workflow:
        return self.rollout.workflow

    @property
    def policies(self) -> dict[str, Policy]:
        """The policies built (under ``lora_per_role`` the bases until adapters attach)."""
        return self.rollout.policies

    @property
    def routing(self) -> dict[str, str]:
        """Role → the policy that acts for it now (its LoRA base until adapters attach)."""
        return self.rollout.routing

    @property
    def generator(self) -> Generator:
        return self.rollout.generator

    @property
    def sampling(self) -> Sampling:
        """How training rollouts sample; the learner's loss temperature is this ``temperature``."""
        return self.rollout.sampling

    def play(self, tasks: Sequence[Any], play: Callable[[list[Any]], RolloutResult]) -> RolloutResult:
        """``play`` this process's share of ``tasks`` and gather every process's result (``play_shared``), once the
        rollout backend has started what the policies acting now need (every process at once)."""
        self.rollout.start_generator()
        return play_shared(self.world, tasks, play)

    def tokenizers(self) -> dict[str, Any]:
        """Each policy's tokenizer by name (a scripted role's pseudo-policy: ``NoTokens``, its rows have no ids)."""
        scripted = {name: NoTokens() for name in self.routing.values() if is_scripted(name)}
        return {**scripted, **{name: p.tokenizer for name, p in self.policies.items()}}

    @property
    def adapters_pending(self) -> bool:
        """An adapter regime whose bases have not been split into adapters yet (before ``attach_adapters``)."""
        return uses_adapters(self.cfg.policy) and all(p.adapter is None for p in self.policies.values())

    def attach_adapters(self, saved: dict[str, str] | None = None) -> None:
        """Adapter regimes: split each (warm-started) base into one adapter per policy it serves (drawn from the run
        seed), loading ``saved`` adapter dirs by policy name (a resume); every role acts through its own adapter from
        then on."""
        policies = attach_all_adapters(self.policies, self.role_map, self.cfg.policy, self.run_dir, saved,
                                       self.cfg.seed)
        self.rollout.policies = policies
        self.rollout.routing = {**self.rollout.routing, **routing(self.role_map, policies)}  # scripted roles stay


def build_rollout(cfg: DictConfig, workflow: Workflow, policies: dict[str, Policy], routes: dict[str, str]) -> Rollout:
    """The rollout of ``workflow`` by ``policies`` routed by ``routes`` (role → policy): the config's backend,
    sampling, mode and tree selection (greedy for an algorithm without one: only at_grpo branches). A run's, and its
    rollout worker's (``training/rows/rollout_worker.py``)."""
    return Rollout(workflow, policies, routes, BACKENDS.get(cfg.rollout.backend)(cfg), sampling_from(cfg),
                   sampling_from(cfg, evaluation=True), cfg.algorithm.mode, cfg.algorithm.get("selection", "greedy"),
                   CREDITS.get(cfg.credit.name).references)


def build_run(cfg: DictConfig, run_dir: Path) -> Run:
    """Check ``cfg`` and build what the run acts with (seeding Python and torch from ``cfg.seed``).

    The policies load from where the config says (``PolicySource.of``: a resume's checkpoint, ``trainer.init_from``,
    ``marl eval``'s ``load=``, else ``cfg.model``); a decoupled sub trainer (``trainer.role=sub``) builds only its
    roles' policies, and a scripted role (``policy.scripted``) gets none: its actor acts for it.
    """
    check_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if OmegaConf.select(cfg, "trainer.deterministic", default=False):
        determinism.apply(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    workflow = build_team(cfg)
    role_map = run_role_map(cfg)
    device = placement(cfg, role_map)
    source = PolicySource.of(cfg)
    mine = sub_roles(cfg, role_map) if OmegaConf.select(cfg, "trainer.role") == "sub" else role_map
    owned = {r: p for r, p in role_map.items() if r in mine}
    policies = source.load(cfg, run_dir, owned, device)
    rollout = build_rollout(cfg, workflow, policies, {**routing(role_map, policies), **scripted_routing(cfg.policy)})
    staleness = Staleness(OmegaConf.select(cfg, "trainer.max_staleness", default=0))
    return Run(cfg, run_dir, role_map, rollout, source, World.current(), staleness)
