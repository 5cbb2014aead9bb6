"""``marl train --help``: runnable experiments only; ``--help <group>`` prints that group's config reference."""

import html

import yaml

from marl_cli.cli.help import help_text, is_building_block, runnable_experiments
from marl_cli.config.paths import config_dir
from marl_cli.config.reference import section_text
from tests.helpers import cli

CONF = config_dir()
EXPERIMENTS = CONF / "experiment"


def included_experiments() -> set[str]:
    """Experiment paths that other experiment files include in their defaults lists."""
    out = set()
    for path in EXPERIMENTS.rglob("*.yaml"):
        for entry in yaml.safe_load(path.read_text()).get("defaults") or []:
            if isinstance(entry, str) and entry.startswith("/experiment/"):
                out.add(entry.removeprefix("/experiment/").split("@")[0])
    return out


def test_building_blocks_are_included_elsewhere_and_not_listed():
    blocks = {str(p.relative_to(EXPERIMENTS).with_suffix("")) for p in EXPERIMENTS.rglob("*.yaml")
              if is_building_block(p)}
    assert {"paper/at_grpo/common", "paper/mgrpo/common", "toy/table/budget", "toy/table/plan_path",
            "paper/at_grpo/benchmarks/sudoku", "paper/at_grpo/models/qwen3_8b"} <= blocks
    assert blocks <= included_experiments()  # a marked file is a part of other experiments, never a lone run
    runnable = {str(p.relative_to(EXPERIMENTS).with_suffix("")) for p in runnable_experiments(CONF)}
    assert not runnable & blocks and {"embedded", "toy/plan_path_grpo", "paper/mgrpo/gaia/co_training"} <= runnable
    listed = help_text("train")
    for part in ("common", "benchmarks", "models", "budget", "toy/table/{code,"):
        assert part not in listed
    assert "toy/table/{code_at_grpo_per_role," in listed and "paper/at_grpo/{qwen3_1_7b,qwen3_8b}/" in listed


def test_help_group_prints_its_reference_section():
    result = cli("train", "--help", "trainer")
    assert result.returncode == 0
    assert result.stdout == html.unescape(section_text("trainer")) + "\n"
    assert "| `trainer.learning_rate` | float |" in result.stdout
    assert "`rollout.max_new_tokens`" in cli("eval", "--help", "rollout").stdout
    unknown = cli("train", "--help", "trainr")
    assert "no reference section 'trainr'; choose from: env," in unknown.stdout


def test_help_names_the_default_experiment_and_the_opt_out():
    train, evaluate = help_text("train"), help_text("eval")
    assert "marl train --cfg job " in train and "experiment=embedded --cfg job" not in train
    assert "marl train experiment=null " in train and "starts from experiment=embedded" in train
    assert "marl eval --cfg job " in evaluate and "marl eval experiment=null " in evaluate  # the same default
