"""Every config in conf/ composes; typos and type errors give a one-line error."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import register_configs
from marl_cli.config.validate import check_overrides, sweep_variants
from tests.helpers import marl

register_configs()
CONF = config_dir()
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml")) if g != "experiment"]
EXPERIMENTS = sorted(str(p.relative_to(CONF / "experiment").with_suffix(""))
                     for p in (CONF / "experiment").rglob("*.yaml"))


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("model", "hf"):
        overrides.append("model.name_or_path=some/model")
    if (group, option) == ("dry_run", "cpu_embedded"):
        overrides.append("env=math")
    cfg = _compose(overrides)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    cfg = _compose([f"experiment={experiment}"])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert cfg.name != "default"


def test_config_dir_is_the_checkout_conf():
    assert Path(__file__).resolve().parents[2] / "conf" == CONF


@pytest.mark.parametrize("override,message", [
    ("trainer.learnin_rate=1", "trainer.learnin_rate: no such key; valid keys: steps, learning_rate"),
    ("trainer.steps=abc", "trainer.steps: Value 'abc' of type 'str' could not be converted to Integer"),
    ("env=plan_pth", "env=plan_pth: no such option; choose from: code, math, plan_path, research, sokoban, sudoku"),
    ("seeed=1", "seeed: no such key; valid keys: env, workflow"),
    ("env.size=1.5", "env.size: Value '1.5' of type 'float' could not be converted to Integer"),
])
def test_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        check_overrides("train", [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_every_sweep_value_is_checked():
    assert sweep_variants(["a=1,2", "b=x", "c=3,4"]) == [["a=1", "b=x", "c=3"], ["a=2", "b=x", "c=3"],
                                                         ["a=1", "b=x", "c=4"]]
    with pytest.raises(ConfigError, match="trainer.steps"):
        check_overrides("train", ["trainer.steps=1,oops"])


def test_cli_typo_exits_2_with_one_line():
    out = marl("train", "trainer.learnin_rate=1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marl train: error: trainer.learnin_rate: no such key")
    assert "Traceback" not in out.stderr


def test_cli_semantic_error_exits_2(tmp_path):
    out = marl("train", "policy.name=bogus", "logger=none", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "marl train: error: policy.name='bogus' is not a regime; choose from: shared, per_role, lora_per_role")


def test_cli_help_lists_commands_and_groups():
    top = marl("--help")
    assert top.returncode == 0 and "train" in top.stdout
    unknown = marl("nope")
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr
    app = marl("train", "--help")
    assert app.returncode == 0
    for group in ("env", "workflow", "algorithm", "policy", "model", "rollout", "trainer", "logger", "experiment"):
        assert f"{group}:" in app.stdout
