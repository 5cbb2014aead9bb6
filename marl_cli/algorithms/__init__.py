"""Pure functions from sample rows to advantages. Every module of this package registers its algorithms in
``ALGORITHMS`` when imported (all are imported here, so a new estimator is one module plus its YAML)."""

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.config.registry import import_modules

import_modules(__name__, __path__)

__all__ = ["ALGORITHMS", "Algorithm"]
