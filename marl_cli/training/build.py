"""What every marl app builds from a run config: the device, the team (workflow over its env) and sampling."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from marl_cli.config.errors import ConfigError
from marl_cli.envs import ENVS, build_env
from marl_cli.rollout.generation import Sampling
from marl_cli.sandbox import Sandbox
from marl_cli.workflows import WORKFLOWS, build_workflow
from marl_cli.workflows.base import Workflow


def resolve_device(name: str) -> torch.device:
    """``device=auto|cpu|cuda[:N]`` as a torch device; a clear error when CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but no CUDA device is visible; use device=cpu or device=auto")
    return torch.device(name)


def sampling_from(rollout: Any, model_cfg: Any, temperature: float) -> Sampling:
    """Generation settings from the ``rollout`` and ``model`` configs at ``temperature`` (0: greedy)."""
    return Sampling(temperature=temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                    max_new_tokens=rollout.max_new_tokens, max_prompt_length=rollout.max_prompt_length,
                    batch_size=rollout.batch_size, use_chat_template=model_cfg.use_chat_template)


def build_team(cfg: DictConfig) -> Workflow:
    """The workflow over its environment, with a sandbox when either executes model-written code."""
    runs_code = any(getattr(registry.get(name), "runs_code", False)
                    for registry, name in ((ENVS, cfg.env.name), (WORKFLOWS, cfg.workflow.name)))
    sandbox = Sandbox(cfg.sandbox) if runs_code else None
    return build_workflow(cfg.workflow, build_env(cfg.env, cfg.seed, sandbox))
