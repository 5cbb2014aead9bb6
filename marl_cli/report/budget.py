"""Whether a run had its experiment's budget: the budget keys its overrides changed from the experiment file's.

A run started as ``experiment=<x> trainer.steps=2`` is not a cell of ``<x>``'s table as the experiment
defines it. ``budget_differences`` composes the run's experiment without the run's budget overrides (the
experiment's own values) and names each key whose value differs, e.g. ``trainer.steps=2 (experiment: 30)``;
the table marks such rows with a footnote.
"""

from __future__ import annotations

import functools
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs

BUDGET_KEYS = ("trainer.steps", "rollout.tasks_per_step", "algorithm.num_generations", "trainer.num_iterations",
               "trainer.mini_batch_size", "env.eval_size", "rollout.max_new_tokens", "trainer.warmstart.enabled",
               "trainer.warmstart.num_examples", "trainer.warmstart.epochs")
"""What a run spends: steps, tasks and samples per step, passes, held-out tasks, tokens, the warm start."""


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(config, dict):
            return None
        config = config.get(part)
    return config


def experiment_of(overrides: list[str]) -> str | None:
    """The experiment a run's overrides name (``experiment=<x>``), or None."""
    names = [o.split("=", 1)[1] for o in overrides if _key(o) == "experiment" and "=" in o]
    return names[-1] if names and names[-1] not in ("", "null") else None


def budget_differences(config: dict[str, Any], overrides: list[str], ignored: tuple[str, ...] = ()) -> list[str]:
    """``key=ours (experiment: theirs)`` for each budget key the run's ``overrides`` set to a value other than
    its experiment's; empty without an experiment, without such overrides, or when the experiment no longer
    composes. ``ignored``: override keys (and their sub-keys) left out of the composition (bookkeeping)."""
    changed = [o for o in overrides if _key(o) in BUDGET_KEYS]
    if experiment_of(overrides) is None or not changed:
        return []
    kept = tuple(o for o in overrides if o not in changed and not any(
        _key(o) == i or _key(o).startswith(i + ".") for i in ("hydra", *ignored)))
    reference = _composed(kept)
    if reference is None:
        return []
    keys = dict.fromkeys(_key(o) for o in changed)
    return [f"{k}={_get(config, k)} (experiment: {_get(reference, k)})" for k in keys
            if _get(config, k) != _get(reference, k)]


@functools.lru_cache(maxsize=64)
def _composed(overrides: tuple[str, ...]) -> dict[str, Any] | None:
    """``conf/train.yaml`` composed with ``overrides`` as a plain dict, or None when it does not compose."""
    try:
        register_configs()
        if GlobalHydra.instance().is_initialized():  # inside `marl report`'s own Hydra app (same config dir)
            cfg = compose(config_name="train", overrides=list(overrides))
        else:
            with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
                cfg = compose(config_name="train", overrides=list(overrides))
    except Exception:  # an experiment renamed or removed since the run, a plug-in not loaded: nothing to compare
        return None
    return OmegaConf.to_container(cfg, resolve=False)
