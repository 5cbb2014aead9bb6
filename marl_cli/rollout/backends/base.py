"""The rollout-backend registry (``rollout.backend``) and the contract every backend's generator keeps.

A backend is a factory ``(run config) -> Generator`` (the protocol below; the rollout engine depends on it,
never on a concrete backend). A factory may say ``requires = Requirement(...)`` (a package it imports;
checked before the run starts). Factories import their engine only when called, so naming a backend costs
nothing while a config is validated.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import Registry

if TYPE_CHECKING:
    from marl_cli.policies.regime import Policy
    from marl_cli.rollout.generation import Generation, Sampling


@runtime_checkable
class Generator(Protocol):
    """What a rollout backend's generator does (``hf``: ``rollout/generation.py::HFGenerator``; ``vllm``:
    ``rollout/vllm_generator.py::VLLMGenerator``)."""

    calls: int
    """Generate calls made so far (one per batch sent to the model)."""

    def generate(self, policy: Policy, prompts: list[str], sampling: Sampling) -> list[Generation]:
        """Completions of ``prompts`` with the sampler's log-prob of every sampled token, from the policy's current
        weights (a backend with its own copy of the weights syncs them itself)."""
        ...

    def start(self, policies: list[Policy]) -> None:
        """The policies about to act: every process of a multi-process run calls it at once, before it plays its
        share of a rollout, so engines that join the processes' group start together."""
        ...

    def release(self) -> None:
        """The policies are about to train: free what generation holds."""
        ...


def check_backend(cfg: Any) -> None:
    """Every backend's rules: the package it imports (``requires``) is installed, and ``policy.devices`` (which
    places full-model policies in this process) is for ``rollout=hf`` (other backends place their engines)."""
    backend = cfg.rollout.backend
    needs = getattr(BACKENDS.get(backend), "requires", None)
    if needs and importlib.util.find_spec(needs.module) is None:
        raise ConfigError(f"rollout={backend} needs {needs.module}: {needs.install}")
    if cfg.policy.devices and backend != "hf":
        raise ConfigError(f"policy.devices works with rollout=hf for now (rollout={backend} places its "
                          "engines itself)")


BACKENDS: Registry[Callable[[Any], Generator]] = Registry("rollout.backend", "rollout", check=check_backend)


@dataclass(frozen=True)
class Requirement:
    """A package a backend needs, and how to install it (the one-line error when it is missing)."""

    module: str
    install: str

