"""Rollout backends by name: every module of this package registers its backend in ``BACKENDS`` when
imported (all are imported here, so a new backend is one module plus its YAML)."""

from marl_cli.config.registry import import_modules
from marl_cli.rollout.backends.base import BACKENDS

import_modules(__name__, __path__)

__all__ = ["BACKENDS"]
