"""Where ``marl train`` / ``marl eval`` start (``cli.first_run``): the embedded run, or the recipe of the task family or
method the command line switches to (that each recipe picks the options it is declared with: ``tests/config/
test_compose.py``, which composes every experiment)."""

from __future__ import annotations

import pytest

from marl_cli.cli.first_run import RECIPES, recipe_for, with_default
from marl_cli.envs.base import ENVS
from marl_cli.plugins import register_configs

register_configs()


def test_every_task_family_has_a_recipe_and_starts_with_its_single_agent_one():
    assert sorted({r.env for r in RECIPES}) == sorted(ENVS.names())
    for env in ENVS.names():
        first = next(r for r in RECIPES if r.env == env)
        assert first.workflow in ("single_agent", "solo_research", "game") and first.policy == "shared"


@pytest.mark.parametrize(("args", "experiment"), [
    ([], "embedded"),
    (["seed=3", "trainer.steps=2"], "embedded"),
    (["env=plan_path", "credit=hicra"], "embedded"),  # the embedded run fits these: it stays
    (["workflow=tool_plan", "algorithm=at_grpo", "policy=per_role"], "embedded"),
    (["env=sudoku", "trainer.steps=2"], "toy/table/sudoku_grpo"),  # a family switch: the family's recipe
    (["env=math"], "toy/table/math_grpo"),
    (["env=code"], "toy/table/code_grpo"),
    (["env=sokoban"], "toy/table/sokoban_grpo"),
    (["env=research"], "toy/research_single"),
    (["env=math", "workflow=tool_reason", "policy=per_role"], "toy/table/math_at_grpo_per_role"),
    (["env=sudoku", "workflow=tool_plan", "algorithm=at_grpo", "policy=shared"], "toy/table/sudoku_at_grpo_shared"),
    (["algorithm=ppo"], "toy/values/plan_path_ppo"),  # a method the embedded run does not fit: its recipe
    (["algorithm=archer"], "toy/values/plan_path_archer"),
    (["workflow=deep_research"], "toy/research_mgrpo"),
    (["algorithm=m_grpo"], "embedded"),  # one agent: M-GRPO is GRPO at the trajectory level, the embedded run fits
])
def test_the_recipe_a_command_line_starts_from(args, experiment):
    assert recipe_for("train", args).experiment == experiment


def test_the_switch_is_said_in_one_line_and_an_explicit_experiment_wins(capsys):
    assert with_default("train", ["env=sudoku"])[0] == ["experiment=toy/table/sudoku_grpo", "env=sudoku"]
    assert capsys.readouterr().err == ("marl train: env=sudoku: starting from experiment=toy/table/sudoku_grpo, its "
                                       "recipe (name an experiment= to start from another, experiment=null for the "
                                       "bare group defaults)\n")
    assert with_default("train", ["seed=1"])[0] == ["experiment=embedded", "seed=1"]
    for args in (["experiment=toy/table/math_grpo", "env=sudoku"], ["experiment=null", "env=math"],
                 ["trainer.resume=/runs/a", "env=math"]):
        assert with_default("train", args) == (args, None)
    assert capsys.readouterr().err == ""


def test_an_env_without_a_recipe_starts_from_the_bare_group_defaults(monkeypatch, capsys):
    monkeypatch.setattr("marl_cli.cli.first_run.RECIPES", RECIPES[:1])
    assert recipe_for("train", ["env=sudoku"]) is None
    assert with_default("train", ["env=sudoku"])[0] == ["~experiment", "env=sudoku"]
    assert capsys.readouterr().err == ("marl train: env=sudoku: no recipe fits; starting from the bare group defaults "
                                       "(experiment=null)\n")


def test_a_recipe_that_does_not_fit_the_command_line_gives_way_to_the_bare_defaults():
    """The reasoning-gym recipe's arithmetic parameters would be refused by maze: the bare group defaults fit."""
    assert recipe_for("train", ["env=reasoning_gym"]).experiment == "envs/reasoning_gym_basic_arithmetic"
    assert recipe_for("train", ["env=reasoning_gym", "env.dataset=maze", "+env.params.min_dist=3"]) is None
    assert recipe_for("train", ["env=reasoning_gym", "env.dataset=mazze"]) is None  # nothing fits: the error is the
    # command line's own (the dataset's name), not one about the recipe's parameters
