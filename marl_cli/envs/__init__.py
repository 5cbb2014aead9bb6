"""Environments by name: every module of this package registers its families in ``ENVS`` when imported
(all are imported here, so a new environment is one module plus its YAML); ``build_env`` builds one."""

from __future__ import annotations

from typing import Any

from marl_cli.config.registry import frozen, import_modules
from marl_cli.envs.base import ENVS, Env

import_modules(__name__, __path__)


def build_env(cfg: Any, seed: int, sandbox: Any = None) -> Env:
    """The environment named by ``cfg.name``; ``sandbox`` runs model-written code for it."""
    return ENVS.get(cfg.name)(frozen(cfg), seed, sandbox)
