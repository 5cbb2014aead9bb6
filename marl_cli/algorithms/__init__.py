"""Pure functions from sample rows to advantages. Every module of this package registers its algorithms in
``ALGORITHMS`` when imported (all are imported here, so a new estimator is one module plus its YAML)."""

import importlib
import pkgutil

from marl_cli.algorithms.base import ALGORITHMS, Algorithm

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm"]
