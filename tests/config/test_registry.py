"""A plug-in is built with its settings resolved once and read-only (``registry.frozen``)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from marl_cli.config.paths import config_dir
from marl_cli.config.registry import frozen
from marl_cli.envs import build_env
from marl_cli.plugins import register_configs
from marl_cli.workflows import build_workflow

register_configs()


def test_an_env_and_a_workflow_read_their_settings_resolved_and_cannot_change_them():
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=embedded", "workflow.max_turns=5"])
    assert OmegaConf.to_yaml(cfg.env, resolve=False).count("${workflow.max_turns}") == 1
    env = build_env(cfg.env, 0)
    workflow = build_workflow(cfg.workflow, env)
    for built, source in ((env.cfg, cfg.env), (workflow.cfg, cfg.workflow)):
        assert "${" not in OmegaConf.to_yaml(built, resolve=False)
        assert OmegaConf.to_container(built) == OmegaConf.to_container(source, resolve=True)
        with pytest.raises(ReadonlyConfigError):
            built.name = "other"
    assert env.cfg.actions_per_episode == 5
    cfg.workflow.max_turns = 2  # resolved when built: the env keeps the value it was built with
    assert env.cfg.actions_per_episode == 5


def test_a_missing_value_stays_missing_and_anything_else_comes_back_as_it_is():
    node = frozen(OmegaConf.create({"source": "???", "size": 4}))
    assert OmegaConf.is_missing(node, "source") and node.size == 4
    plain = {"size": 4}
    assert frozen(plain) is plain
