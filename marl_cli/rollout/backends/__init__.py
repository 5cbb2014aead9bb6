"""Rollout backends by name: every module of this package registers its backend in ``BACKENDS`` when
imported (all are imported here, so a new backend is one module plus its YAML)."""

import importlib
import pkgutil

from marl_cli.rollout.backends.base import BACKENDS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BACKENDS"]
