"""Credit beyond a row's group-relative advantage (``credit=<name>``): every module of this package registers its
method in ``CREDITS`` when imported (all are imported here, so a new method is one module plus its YAML)."""

from marl_cli.config.registry import import_modules
from marl_cli.credit.base import CREDITS, Credit

import_modules(__name__, __path__)

__all__ = ["CREDITS", "Credit"]
