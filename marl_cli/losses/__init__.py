"""Loss terms added to TRL's policy loss, a plug-in kind (``loss=<name>``). Every module of this package registers its
terms in ``LOSS_TERMS`` when imported (all are imported here)."""

from marl_cli.config.registry import import_modules
from marl_cli.losses.base import LOSS_TERMS, LossKind, LossTerm

import_modules(__name__, __path__)

__all__ = ["LOSS_TERMS", "LossKind", "LossTerm"]
