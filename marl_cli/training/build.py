"""One assembly for every marl app (train, eval, bench, tests): ``build_run`` turns a checked config into
the team (workflow over its env), the role→policy map, the policies, the rollout backend and sampling."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from marl_cli import determinism
from marl_cli.config.validate import check_config, check_device
from marl_cli.envs import ENVS, build_env
from marl_cli.policies.regime import Placement, Policy, attach_adapters, build_policies, routing
from marl_cli.policies.roles import LORA_BASE, assign_roles
from marl_cli.rollout.backends import BACKENDS
from marl_cli.rollout.engine import RolloutResult
from marl_cli.rollout.generation import Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.training.distributed import World, play_shared
from marl_cli.workflows import WORKFLOWS, build_workflow
from marl_cli.workflows.base import Workflow

PolicyLoader = Callable[[dict[str, str], Placement], dict[str, Policy]]
"""``(role→policy map of the roles to build, where each goes) -> policies by name``: where a run's policies come
from."""


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


def sampling_from(rollout: Any, model_cfg: Any, temperature: float) -> Sampling:
    """Generation settings from the ``rollout`` and ``model`` configs at ``temperature`` (0: greedy)."""
    return Sampling(temperature=temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                    max_new_tokens=rollout.max_new_tokens, max_prompt_length=rollout.max_prompt_length,
                    batch_size=rollout.batch_size, use_chat_template=model_cfg.use_chat_template,
                    system_prompts=dict(model_cfg.system_prompts),
                    chat_template_kwargs=OmegaConf.to_container(model_cfg.chat_template_kwargs))


def init_seed(cfg: DictConfig) -> int:
    """The seed the policies' initial weights come from: ``trainer.warmstart.seed`` when a pinned warm start
    trains them, else the run seed."""
    ws = cfg.trainer.warmstart
    return ws.seed if ws.enabled and ws.seed is not None else cfg.seed


def build_team(cfg: DictConfig, seed: int | None = None, sandbox: Sandbox | None = None) -> Workflow:
    """The workflow over its environment seeded by ``seed`` (default: the run seed), with ``sandbox`` (default:
    a new one when either executes model-written code)."""
    runs_code = any(getattr(registry.get(name), "runs_code", False)
                    for registry, name in ((ENVS, cfg.env.name), (WORKFLOWS, cfg.workflow.name)))
    if sandbox is None and runs_code:
        sandbox = Sandbox(cfg.sandbox)
    return build_workflow(cfg.workflow, build_env(cfg.env, cfg.seed if seed is None else seed, sandbox))


@dataclass
class Run:
    """What a run acts with.

    Args:
        cfg: the checked run config.
        run_dir: where the run writes (the tiny model's initial weights too).
        workflow: the team over its environment.
        role_map: role → the policy it acts through.
        policies: the policies built (under ``lora_per_role`` the base until adapters attach).
        routing: role → the policy that acts for it now (the LoRA base until adapters attach).
        generator: the rollout backend's generator.
        train_sampling: sampling of training rollouts.
        eval_sampling: sampling of evaluations.
        world: the processes training the run together (``training/distributed.py``).
    """

    cfg: DictConfig
    run_dir: Path
    workflow: Workflow
    role_map: dict[str, str]
    policies: dict[str, Policy]
    routing: dict[str, str]
    generator: Any
    train_sampling: Sampling
    eval_sampling: Sampling
    world: World = field(default_factory=World)

    def play(self, tasks: Sequence[Any], play: Callable[[list[Any]], RolloutResult]) -> RolloutResult:
        """``play`` this process's share of ``tasks`` and gather every process's result (``play_shared``), once the
        rollout backend has started what the policies acting now need (every process at once)."""
        self.generator.start([self.policies[name] for name in dict.fromkeys(self.routing.values())])
        return play_shared(self.world, tasks, play)

    def tokenizers(self) -> dict[str, Any]:
        return {name: p.tokenizer for name, p in self.policies.items()}

    @property
    def adapters_pending(self) -> bool:
        """An adapter regime whose base has not been split into adapters yet (before ``attach_adapters``)."""
        return LORA_BASE in self.policies

    def attach_adapters(self, saved: dict[str, str] | None = None) -> None:
        """Adapter regimes: split the (warm-started) base into one adapter per policy, loading ``saved``
        adapter dirs by policy name (a resume); every role acts through its own adapter from then on."""
        self.policies = attach_adapters(self.policies[LORA_BASE], self.role_map, self.cfg.policy, self.run_dir,
                                        saved)
        self.routing = routing(self.role_map, self.policies)


def build_run(cfg: DictConfig, run_dir: Path, load: PolicyLoader | None = None, roles: Collection[str] | None = None,
              eval_temperature: float | None = None) -> Run:
    """Check ``cfg`` and build what the run acts with (seeding Python and torch from ``cfg.seed``).

    ``load`` builds the policies (default: from ``cfg.model``, fp32 master weights for training);
    ``roles`` limits the policies built to those roles' (a decoupled sub trainer builds only its own);
    ``eval_temperature`` overrides ``rollout.eval_temperature`` (``marl eval``'s ``eval.temperature``).
    """
    check_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if OmegaConf.select(cfg, "trainer.deterministic", default=False):
        determinism.apply(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    workflow = build_team(cfg)
    role_map = assign_roles(cfg.policy, workflow.roles)
    device = placement(cfg, role_map)
    owned = {r: p for r, p in role_map.items() if roles is None or r in roles}
    if load is None:
        policies = build_policies(owned, cfg.model, init_seed(cfg), run_dir, device, None, cfg.policy.name,
                                  master_weights=True)
    else:
        policies = load(owned, device)
    temperature = cfg.rollout.eval_temperature if eval_temperature is None else eval_temperature
    return Run(cfg, run_dir, workflow, role_map, policies, routing(role_map, policies),
               BACKENDS.get(cfg.rollout.backend)(cfg), sampling_from(cfg.rollout, cfg.model, cfg.rollout.temperature),
               sampling_from(cfg.rollout, cfg.model, temperature), World.current())
