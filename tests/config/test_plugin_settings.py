"""A plug-in with a setting of its own is two files: its module (the class or function, a schema subclassing the
group's generic schema, ``register(name, schema=..., check=...)``) and its YAML (``<group>/<name>.yaml`` whose
defaults list starts with ``base_<name>``). Here a throwaway estimator, rollout backend and policy regime are
written into a temporary dir, loaded through ``MARL_PLUGINS`` and found through a config dir, like a user's."""

from __future__ import annotations

import logging
import os
import sys

import pytest
from hydra import compose, initialize_config_dir

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config import registry
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.registry import PLUGIN_ENV, load_plugins
from marl_cli.config.validate import check_overrides
from marl_cli.policies.roles import REGIMES
from marl_cli.rollout.backends import BACKENDS
from tests.helpers import install_plugin, refusal

MODULE = "marl_settings_plugin"
PLUGIN = '''
from dataclasses import dataclass

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.grpo import GRPOConfig
from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import PolicyConfig, RolloutConfig, bounded
from marl_cli.policies.roles import REGIMES, Regime
from marl_cli.rollout.backends.base import BACKENDS


@dataclass
class ScaledConfig(GRPOConfig):
    """GRPO advantages times a factor."""

    name: str = "scaled"
    scale: float = bounded(0.5, gt=0.0, le=1.0)  # the factor


def check_scaled(cfg):
    if cfg.algorithm.scale < 1.0 and not cfg.algorithm.norm_by_std:
        raise ConfigError(f"algorithm.scale={cfg.algorithm.scale} needs algorithm.norm_by_std=true")


def scaled(rows, cfg, rng, rollouts=None):
    return rows, {}


ALGORITHMS.register("scaled", schema=ScaledConfig, check=check_scaled)(Algorithm(scaled))


@dataclass
class EchoConfig(RolloutConfig):
    """A backend answering every prompt with itself."""

    backend: str = "echo"
    echo_chunk: int = bounded(4, ge=1)  # prompts per generate call


def check_echo(cfg):
    if cfg.rollout.echo_chunk > cfg.rollout.batch_size:
        raise ConfigError(f"rollout.echo_chunk={cfg.rollout.echo_chunk} exceeds rollout.batch_size")


@BACKENDS.register("echo", schema=EchoConfig, check=check_echo)
def echo_backend(cfg):
    raise NotImplementedError


@dataclass
class PairsConfig(PolicyConfig):
    """Roles share one policy per group of pair_size."""

    name: str = "pairs"
    pair_size: int = bounded(1, ge=1)  # roles per policy


def check_pairs(cfg):
    if cfg.policy.pair_size > len(cfg.workflow.roles):
        raise ConfigError(f"policy.pair_size={cfg.policy.pair_size}: the workflow has fewer roles")


REGIMES.register("pairs", schema=PairsConfig, check=check_pairs)(Regime(lambda role: "pair"))
'''
YAMLS = {
    "algorithm/scaled.yaml": "defaults:\n  - base_scaled\n  - _self_\n\nname: scaled\n",
    "rollout/echo.yaml": "defaults:\n  - base_echo\n  - _self_\n\nbackend: echo\n",
    "policy/pairs.yaml": "defaults:\n  - base_pairs\n  - _self_\n\nname: pairs\n",
}
CHOSEN = ["algorithm=scaled", "rollout=echo", "policy=pairs"]


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    """The throwaway plug-ins' module (named in MARL_PLUGINS) and config dir; forgotten after the test."""
    return install_plugin(monkeypatch, tmp_path, MODULE, PLUGIN, YAMLS, [ALGORITHMS, BACKENDS, REGIMES])


def test_each_kind_composes_with_its_settings_default(plugin):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*CHOSEN, f"hydra.searchpath=[file://{plugin}]"])
    assert (cfg.algorithm.scale, cfg.rollout.echo_chunk, cfg.policy.pair_size) == (0.5, 4, 1)
    assert cfg.rollout.tasks_per_step == 16  # the generic schema's keys stay
    check_overrides("train", CHOSEN, [plugin])


@pytest.mark.parametrize("override,message", [
    ("algorithm.scale=0", "algorithm.scale=0.0: must be > 0.0 and <= 1.0"),
    ("algorithm.scale=big", "algorithm.scale: Value 'big' of type 'str' could not be converted to Float"),
    ("rollout.echo_chunk=0", "rollout.echo_chunk=0: must be >= 1"),
    ("rollout.echo_chunk=1.5", "rollout.echo_chunk: Value '1.5' of type 'float' could not be converted to Integer"),
    ("policy.pair_size=-1", "policy.pair_size=-1: must be >= 1"),
    ("policy.pair_size=two", "policy.pair_size: Value 'two' of type 'str' could not be converted to Integer"),
    ("policy.pair_sise=2", "policy.pair_sise: no such key; valid keys: name, assignment"),
    ("algorithm.align_d=2", "algorithm.align_d is a setting of algorithm=m_grpo, not of algorithm=scaled"),
])
def test_a_bad_setting_fails_like_a_built_in_key(plugin, override, message):
    assert refusal([*CHOSEN, override], [plugin]).startswith(message)


def test_the_built_in_keys_fail_in_the_same_words():
    for override, message in (("rollout.max_new_tokens=0", "rollout.max_new_tokens=0: must be >= 1"),
                              ("env.size=1.5", "env.size: Value '1.5' of type 'float' could not be converted")):
        with pytest.raises(ConfigError, match=f"^{message}"):
            check_overrides("train", [override])


@pytest.mark.parametrize("override,message", [
    ("algorithm.norm_by_std=false", "algorithm.scale=0.5 needs algorithm.norm_by_std=true"),
    ("rollout.batch_size=2", "rollout.echo_chunk=4 exceeds rollout.batch_size"),
    ("policy.pair_size=2", "policy.pair_size=2: the workflow has fewer roles"),
])
def test_each_plug_ins_check_runs(plugin, override, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        check_overrides("train", [*CHOSEN, override], [plugin])


def test_a_plug_in_that_imports_torch_is_named_in_a_warning(monkeypatch, tmp_path, caplog):
    fake_torch = "import sys, types\nsys.modules['torch'] = types.ModuleType('torch')\n"  # as if it imported torch
    (tmp_path / "heavy_marl_plugin.py").write_text(fake_torch)
    monkeypatch.setattr(registry, "_loaded", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delitem(sys.modules, "heavy_marl_plugin", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # the real torch (or none) comes back after the test
    del sys.modules["torch"]
    monkeypatch.setenv(PLUGIN_ENV, str(tmp_path / "heavy_marl_plugin.py"))
    with caplog.at_level(logging.WARNING, logger="marl_cli.config.registry"):
        load_plugins()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "heavy_marl_plugin.py imports torch" in warnings[0]
