"""Workflows by name: every module of this package registers its workflows in ``WORKFLOWS`` when imported
(all are imported here, so a new workflow is one module plus its YAML); ``build_workflow`` builds one."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from marl_cli.envs.base import Env
from marl_cli.workflows.base import WORKFLOWS, Workflow

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def build_workflow(cfg: Any, env: Env) -> Workflow:
    """The workflow named by ``cfg.name`` over ``env``."""
    return WORKFLOWS.get(cfg.name)(cfg, env)
