"""Compose a config from command-line overrides before a Hydra app runs, and explain failures in one line.

Hydra reports composition errors over several lines with exit code 1. ``check_overrides`` composes
every value of every sweep once (each alone, the other sweeps at their first value) and raises a
``ConfigError`` naming the key and, where there is a list, the valid choices.
"""

from __future__ import annotations

import dataclasses
import re

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Plain override lists covering every value of every sweep (``k=a,b``, ``range(...)``) at least once."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices: list[list[str]] = []
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            try:
                values = list(override.sweep_string_iterator())
            except Exception:  # interval sweeps (optuna) have no finite list; their key is still checked
                values = [override.get_value_element_as_str().split("(")[-1].split(",")[0].strip(" )")]
            choices.append([f"{key}={v}" for v in values] or [override.input_line])
        else:
            choices.append([override.input_line])
    first = [c[0] for c in choices]
    variants = [first]
    for i, options in enumerate(choices):
        for option in options[1:]:
            variants.append([*first[:i], option, *first[i + 1:]])
    return variants


def _keys_of(object_type: object) -> list[str]:
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [f.name for f in dataclasses.fields(object_type)]
    return []


def describe(exc: BaseException) -> str:
    """One line saying what is wrong with the config and what would be valid."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, MissingConfigException):
            missing = re.search(r"Could not find '([^']+)'", str(err))
            options = [o for o in (err.options or []) if not o.startswith("base_")]
            what = missing.group(1) if missing else err.missing_cfg_file
            group, _, choice = str(what).rpartition("/")
            if group:
                return f"{group}={choice}: no such option; choose from: {', '.join(options)}"
            return " ".join(str(err).split())
    for err in chain:
        if isinstance(err, OmegaConfBaseException) and getattr(err, "full_key", None):
            if isinstance(err, ConfigKeyError | ConfigAttributeError):
                valid = _keys_of(getattr(err, "object_type", None))
                hint = f"; valid keys: {', '.join(valid)}" if valid else ""
                return f"{err.full_key}: no such key{hint}"
            return f"{err.full_key}: {err.msg.splitlines()[0]}"
    return " ".join(str(exc).replace("\t", " ").split())


def check_overrides(config_name: str, overrides: list[str]) -> None:
    """Compose ``config_name`` with ``overrides`` (and each sweep value); raise ConfigError on failure."""
    try:
        variants = sweep_variants(overrides)
    except Exception as exc:
        raise ConfigError(describe(exc)) from exc
    for variant in variants:
        try:
            with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
                compose(config_name=config_name, overrides=variant)
        except Exception as exc:
            raise ConfigError(describe(exc)) from exc
