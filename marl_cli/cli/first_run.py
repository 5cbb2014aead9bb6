"""The run ``marl train`` and ``marl eval`` start from when the command line names no experiment and loads no run:
``experiment=embedded`` (the first run, which learns on a laptop CPU), or, when the command line switches to another
task family (``env=sudoku``) or picks options the embedded run does not fit (``algorithm=ppo``), the recipe for
what it picked: a toy-table experiment that learns at laptop scale. ``experiment=null``: the bare group defaults."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from marl_cli.cli.app import LOADS_A_RUN, key_of, overrides_in
from marl_cli.config.errors import ConfigError
from marl_cli.config.launch import launched_rank
from marl_cli.config.paths import config_dirs_in
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs

FIRST_RUN = "embedded"
"""The experiment a command starts from unless it names one, loads a run or picks what the first run does not fit."""


@dataclass(frozen=True)
class Recipe:
    """A runnable experiment and the group options it picks (``tests/config/test_compose.py`` composes each)."""

    experiment: str
    env: str
    workflow: str = "single_agent"
    algorithm: str = "grpo"
    policy: str = "shared"
    critic: str = "none"
    credit: str = "none"

    def agreement(self, picks: dict[str, str]) -> int:
        """How many of the command line's group options this recipe picks too."""
        return sum(asdict(self).get(group) == option for group, option in picks.items())


RECIPES = (
    Recipe(FIRST_RUN, "plan_path"),
    Recipe("toy/table/plan_path_at_grpo_per_role", "plan_path", "tool_plan", "at_grpo", "per_role"),
    Recipe("toy/table/plan_path_at_grpo_shared", "plan_path", "tool_plan", "at_grpo"),
    Recipe("toy/plan_path_at_grpo_lora", "plan_path", "tool_plan", "at_grpo", "lora_per_role"),
    Recipe("toy/table/plan_path_cory", "plan_path", "cory", "grpo", "per_role"),
    Recipe("toy/values/plan_path_ppo", "plan_path", "tool_plan", "ppo", critic="token"),
    Recipe("toy/values/plan_path_marft_team", "plan_path", "tool_plan", "marft", critic="utterance"),
    Recipe("toy/values/plan_path_archer", "plan_path", "tool_plan", "archer", critic="utterance"),
    Recipe("toy/credit/plan_path_hicra", "plan_path", credit="hicra"),
    Recipe("toy/credit/plan_path_igpo", "plan_path", credit="igpo"),
    Recipe("toy/table/sudoku_grpo", "sudoku"),
    Recipe("toy/table/sudoku_at_grpo_per_role", "sudoku", "tool_plan", "at_grpo", "per_role"),
    Recipe("toy/table/sudoku_at_grpo_shared", "sudoku", "tool_plan", "at_grpo"),
    Recipe("toy/table/sokoban_grpo", "sokoban"),
    Recipe("toy/table/sokoban_at_grpo_per_role", "sokoban", "tool_plan", "at_grpo", "per_role"),
    Recipe("toy/table/sokoban_at_grpo_shared", "sokoban", "tool_plan", "at_grpo"),
    Recipe("toy/table/math_grpo", "math"),
    Recipe("toy/table/math_at_grpo_per_role", "math", "tool_reason", "at_grpo", "per_role"),
    Recipe("toy/table/math_at_grpo_shared", "math", "tool_reason", "at_grpo"),
    Recipe("toy/table/math_cory", "math", "cory", "grpo", "per_role"),
    Recipe("toy/table/code_grpo", "code"),
    Recipe("toy/table/code_at_grpo_per_role", "code", "code_test", "at_grpo", "per_role"),
    Recipe("toy/table/code_at_grpo_shared", "code", "code_test", "at_grpo"),
    Recipe("toy/research_single", "research", "solo_research", "m_grpo"),
    Recipe("toy/research_mgrpo", "research", "deep_research", "m_grpo", "per_role"),
    Recipe("toy/selfplay/kuhn_rae", "openspiel", "game", "rae"),
    Recipe("toy/selfplay/kuhn_grpo", "openspiel", "game", "grpo"),
    Recipe("toy/selfplay/negotiation_rae", "textarena", "game", "rae"),
    Recipe("envs/dataset_arithmetic", "dataset"),
    Recipe("envs/reasoning_gym_basic_arithmetic", "reasoning_gym"),
    Recipe("envs/openenv_guess_number", "openenv"),
    Recipe("envs/verifiers_retry_arithmetic", "verifiers"),
    Recipe("envs/pettingzoo_leduc_selfplay", "pettingzoo", "game"),
    Recipe("envs/pettingzoo_leduc_at_grpo", "pettingzoo", "game", "at_grpo", "per_role"),
)
"""Per task family, its single-agent recipe first (a game's: self-play of one model); then its teams, value methods
and credit methods. The first
recipe that agrees with the most of the command line's group options is the one a command starts from."""
GROUPS = ("env", "workflow", "algorithm", "policy", "critic", "credit")
"""The config groups a recipe is chosen by."""


def picks_in(args: list[str]) -> dict[str, str]:
    """The options the command line picks in :data:`GROUPS` (``env=sudoku``), sweeps (``env=math,code``) left out."""
    picks = {}
    for override in overrides_in(args):
        key, value = key_of(override), override.partition("=")[2]
        if key in GROUPS and value and "," not in value and "(" not in value:
            picks[key] = value
    return picks


def recipe_for(command: str, args: list[str]) -> Recipe | None:
    """The recipe ``args`` start from: the first run where it fits them (their env, if they pick one, and a config
    that checks); else, when they pick an env, that env's recipe agreeing with most of their group options that fits
    them, or None (the bare group defaults: an env without a recipe, or ``env=reasoning_gym env.dataset=maze``,
    which the recipe's arithmetic parameters would break; an error is then about the command line alone); with no
    env picked, the recipe agreeing with most of their group options."""
    picks = picks_in(args)
    first = RECIPES[0]
    if picks.get("env", first.env) == first.env and (not picks or fits(command, first, args)):
        return first
    candidates = sorted((r for r in RECIPES if r.env == picks.get("env", r.env)), key=lambda r: -r.agreement(picks))
    if "env" not in picks or not candidates:  # sorted keeps the first of equals
        return candidates[0] if candidates else None
    return next((r for r in candidates if fits(command, r, args)), None)


def fits(command: str, recipe: Recipe | None, args: list[str]) -> bool:
    """Whether ``args`` over ``recipe`` (None: the bare group defaults) make a config that checks."""
    start = "~experiment" if recipe is None else f"experiment={recipe.experiment}"
    try:
        register_configs()
        check_overrides(command, [start, *overrides_in(args)], config_dirs_in(args))
    except ConfigError:
        return False
    return True


def with_default(command: str, args: list[str]) -> tuple[list[str], Callable[[], str] | None]:
    """``args`` starting from their recipe (:func:`recipe_for`) unless they name an experiment (``experiment=null``
    too: ``run_app`` makes it Hydra's ``~experiment``) or continue or evaluate a run (which keeps its own); with the
    hint that ends a config error the starting point causes (None where no recipe applies). A recipe other than the
    first run is announced in one line."""
    keys = {key_of(o) for o in overrides_in(args)}
    if keys & {"experiment", *LOADS_A_RUN}:
        return args, None
    recipe = recipe_for(command, args)
    picked = " ".join(f"{g}={o}" for g, o in picks_in(args).items())
    if recipe is None:
        announce(command, f"{picked}: no recipe fits; starting from the bare group defaults (experiment=null)")
        return ["~experiment", *args], None
    if recipe.experiment != FIRST_RUN:
        announce(command, f"{picked}: starting from experiment={recipe.experiment}, its recipe (name an experiment= "
                          "to start from another, experiment=null for the bare group defaults)")
    return [f"experiment={recipe.experiment}", *args], start_hint(command, recipe, args)


def announce(command: str, line: str) -> None:
    """One line on stderr, from rank 0 only (every process of a launched run makes the same choice)."""
    if launched_rank() == 0:
        print(f"marl {command}: {line}", file=sys.stderr, flush=True)


def start_hint(command: str, recipe: Recipe, args: list[str]) -> Callable[[], str]:
    """The end of a config error that ``recipe`` causes: naming it, if ``args`` check without it."""

    def hint() -> str:
        try:
            check_overrides(command, ["~experiment", *overrides_in(args)], config_dirs_in(args))
        except ConfigError:
            return ""
        return (f" (marl {command} started from experiment={recipe.experiment}; add experiment=null to start from "
                "the bare group defaults)")

    return hint
