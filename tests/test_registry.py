"""Plug-ins by name: the registries, plug-ins loaded from outside marl, and the worked example of the README."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config import registry
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.registry import Registry, load_plugins
from marl_cli.config.validate import check_overrides
from marl_cli.envs.base import ENVS
from marl_cli.plugins import register_configs
from marl_cli.policies.roles import REGIMES, assign_roles
from marl_cli.rollout.backends import BACKENDS
from marl_cli.workflows.base import WORKFLOWS
from tests.helpers import TINY

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extending"


@pytest.fixture
def isolated(monkeypatch):
    """Plug-ins loaded by a test are forgotten after it."""
    for reg in (ENVS, WORKFLOWS, ALGORITHMS, BACKENDS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
        monkeypatch.setattr(reg, "schemas", dict(reg.schemas))
    monkeypatch.setattr(registry, "_loaded", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delitem(sys.modules, "reverse", raising=False)
    return monkeypatch


def test_a_registry_files_by_name_and_names_the_choices():
    things: Registry[int] = Registry("thing.name")
    things.register("one")(1)
    things.register("two", schema=dict)(2)
    assert things.get("two") == 2 and things.schemas == {"two": dict} and "one" in things
    with pytest.raises(ConfigError, match=r"^thing.name='three' is not registered; choose from: one, two "
                                          r"\(a plug-in's\? name its module in MARL_PLUGINS\)$"):
        things.get("three")
    with pytest.raises(ValueError, match="registered twice"):
        things.register("one")(3)


def test_the_built_in_plug_ins_are_registered():
    # membership, not equality: a new built-in plug-in breaks no test
    assert {"code", "math", "plan_path", "research", "sokoban", "sudoku"} <= set(ENVS.names())
    assert {"single_agent", "tool_plan", "tool_reason", "code_test", "deep_research"} <= set(WORKFLOWS.names())
    assert {"at_grpo", "grpo", "m_grpo"} <= set(ALGORITHMS.names())
    assert ALGORITHMS.get("at_grpo").modes == ("independent", "tree") and ALGORITHMS.get("m_grpo").hierarchical
    assert {"hf", "vllm"} <= set(BACKENDS.names())
    assert {"lora_per_role", "per_role", "shared"} <= set(REGIMES.names())
    assert [REGIMES.get(n).adapters for n in ("lora_per_role", "per_role", "shared")] == [True, False, False]
    assert assign_roles(OmegaConf.create({"name": "per_role", "assignment": {"b": "a"}}), ["a", "b"]) == {"a": "a",
                                                                                                       "b": "a"}


def test_a_plug_in_that_fails_to_import_is_one_line(isolated, tmp_path):
    isolated.setenv(registry.PLUGIN_ENV, f"no_such_module_xyz,{tmp_path / 'missing.py'}")
    with pytest.raises(ConfigError, match="plug-in 'no_such_module_xyz' failed to import: ModuleNotFoundError"):
        load_plugins()


def test_a_plug_in_file_whose_name_is_taken_is_refused(isolated, tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('never imported')\n")
    isolated.setenv(registry.PLUGIN_ENV, str(tmp_path / "json.py"))
    with pytest.raises(ConfigError, match="module name 'json' is taken by .*; rename the plug-in file"):
        load_plugins()


def test_the_worked_example_validates_and_trains_from_its_own_config_dir(isolated, tmp_path):
    from marl_cli.training.loop import train

    isolated.setenv(registry.PLUGIN_ENV, str(EXAMPLE / "reverse.py"))
    register_configs()
    assert "reverse" in ENVS
    assert str(EXAMPLE) in os.environ["PYTHONPATH"].split(os.pathsep)  # a launcher's workers import it by name
    conf = str(EXAMPLE / "conf")
    overrides = ["experiment=reverse", *TINY, "trainer.steps=2", "trainer.warmstart.enabled=false",
                 "env.eval_size=4", "progress=false"]
    check_overrides("train", overrides, [conf])
    with pytest.raises(ConfigError, match=r"env.length=0: must be >= 1"):
        check_overrides("train", [*overrides, "env.length=0"], [conf])
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, f"hydra.searchpath=[file://{conf}]"])
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps"] == 2 and summary["env"] == "reverse"
    assert 0.0 <= summary["eval/success"] <= 1.0
