"""Rewards from models (``reward=<name>``): every module of this package registers its reward model in ``REWARDS``
when imported (all are imported here, so a new kind is one module plus its YAML)."""

from marl_cli.config.registry import import_modules
from marl_cli.rewards.base import REWARDS, ModelRewards, Rewarder, RewardModel, build_rewards

import_modules(__name__, __path__)

__all__ = ["REWARDS", "ModelRewards", "RewardModel", "Rewarder", "build_rewards"]
