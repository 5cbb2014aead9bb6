"""The rollout-backend registry (``rollout.backend``).

A backend is a factory ``(run config) -> generator`` whose generator has
``generate(policy, prompts, sampling) -> list[Generation]`` (completions with the sampler's
log-prob of every sampled token). Factories import their engine only when called, so naming a
backend costs nothing while a config is validated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marl_cli.registry import Registry

BACKENDS: Registry[Callable[[Any], Any]] = Registry("rollout.backend")
