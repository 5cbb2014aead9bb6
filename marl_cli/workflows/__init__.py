"""Workflows by name: every module of this package registers its workflows in ``WORKFLOWS`` when imported
(all are imported here, so a new workflow is one module plus its YAML); ``build_workflow`` builds one."""

from __future__ import annotations

from typing import Any

from marl_cli.config.registry import frozen, import_modules
from marl_cli.envs.base import Env
from marl_cli.workflows.base import WORKFLOWS, Workflow

import_modules(__name__, __path__)


def build_workflow(cfg: Any, env: Env) -> Workflow:
    """The workflow named by ``cfg.name`` over ``env``."""
    return WORKFLOWS.get(cfg.name)(frozen(cfg), env)
