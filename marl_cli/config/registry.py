"""Plug-ins by name: what a config's ``<group>.name`` (or ``rollout.backend``) selects.

One ``Registry`` per kind (environments, workflows, algorithms, policy regimes, rollout backends), each
with its config group. A plug-in registers itself beside its class, with the schema of its config group
and, where it has rules across keys, a check of the composed config::

    @ENVS.register("grid", schema=GridConfig, check=check_grid)
    class GridEnv(Env): ...

The schema is stored in Hydra's ConfigStore as ``<group>/base_<name>`` (``config.schema.register_configs``
walks every registry), so the group's YAML starts its defaults list with ``base_<name>`` and a typo fails at
composition; ``config.validate`` looks up the selected name of every kind and runs its checks. This module
is the bottom of the plug-in system: it imports nothing of marl outside ``config/``, and the plug-ins import
it. Packages outside marl register the same way from a module named in the ``marl.plugins`` entry-point group
or in the ``MARL_PLUGINS`` environment variable (comma-separated modules or ``.py`` files), which every
``marl`` command imports (``load_plugins``, through ``marl_cli.plugins``) before it composes a config.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

from omegaconf import DictConfig, OmegaConf

from marl_cli.config.errors import ConfigError

T = TypeVar("T")
PLUGIN_GROUP = "marl.plugins"
PLUGIN_ENV = "MARL_PLUGINS"
HEAVY = "torch"
"""A package no plug-in should import when it loads: config checks without it take 0.8 s, with it 3 s."""

Check = Callable[[Any], None]
"""A rule across keys of the composed run config: raises a one-line ``ConfigError`` when it is broken."""

log = logging.getLogger(__name__)
_REGISTRIES: dict[str, Registry[Any]] = {}


class Registry(Generic[T]):
    """Named plug-ins of one kind, each with an optional config schema and check.

    Args:
        key: the config key that names a plug-in (``env.name``), used in error messages.
        group: the config group whose schemas this registry holds (``env``); empty for none.
        check: a rule every plug-in of this kind shares, run (before the plug-in's own) when one is selected.
    """

    def __init__(self, key: str, group: str = "", check: Check | None = None):
        self.key = key
        self.group = group
        self.check = check
        self._entries: dict[str, T] = {}
        self.schemas: dict[str, type] = {}
        self.checks: dict[str, Check] = {}
        _REGISTRIES[key] = self

    def register(self, name: str, schema: type | None = None, check: Check | None = None) -> Callable[[T], T]:
        """A decorator filing its argument under ``name`` (``schema`` as ``<group>/base_<name>``; ``check``
        runs on every config that selects it)."""

        def add(entry: T) -> T:
            if name in self._entries and self._entries[name] is not entry:
                raise ValueError(f"{self.key}={name!r} is registered twice")
            self._entries[name] = entry
            if schema is not None:
                self.schemas[name] = schema
            if check is not None:
                self.checks[name] = check
            return entry

        return add

    def get(self, name: str) -> T:
        """The plug-in named ``name``; a one-line ``ConfigError`` naming the choices if there is none."""
        if name not in self._entries:
            raise ConfigError(f"{self.key}={name!r} is not registered; choose from: {', '.join(self.names())} "
                              f"(a plug-in's? name its module in {PLUGIN_ENV})")
        return self._entries[name]

    def selected(self, cfg: Any) -> T:
        """The plug-in ``cfg`` selects (at ``key``); a one-line ``ConfigError`` if it is not registered."""
        return self.get(OmegaConf.select(cfg, self.key))

    def check_selected(self, cfg: Any) -> None:
        """Run the kind's check, then the selected plug-in's own (each raises a one-line ``ConfigError``)."""
        name = OmegaConf.select(cfg, self.key)
        for check in (self.check, self.checks.get(name)):
            if check is not None:
                check(cfg)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def registries() -> list[Registry[Any]]:
    """Every registry made so far, in the order they were made (the plug-in kinds have a ``group``)."""
    return list(_REGISTRIES.values())


def schema_of(group: str, name: str) -> type | None:
    """The schema the plug-in ``name`` of config group ``group`` registered (None: none, or no such plug-in)."""
    return next((r.schemas.get(name) for r in registries() if r.group == group), None)


def frozen(node: Any) -> Any:
    """A plug-in's settings as it is built with them: ``node`` (a config group) with every interpolation resolved
    once, read-only. A plug-in reading its settings on every call (an env's ``step``) then pays a plain lookup,
    not OmegaConf's resolution of ``${workflow.max_turns}`` (~0.5 ms each); a mandatory value left unset stays
    missing. Anything but a ``DictConfig`` comes back as it is."""
    if not isinstance(node, DictConfig):
        return node
    out = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    OmegaConf.set_readonly(out, True)
    return out


def import_modules(package: str, path: list[str]) -> None:
    """Import every module of ``package`` (whose ``__path__`` is ``path``), so each registers its plug-ins."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")


_loaded: set[str] = set()


def load_plugins() -> None:
    """Import every plug-in module named by the ``marl.plugins`` entry points and ``MARL_PLUGINS`` (once each);
    log a warning naming a module whose import pulls in torch (every config check would pay for it)."""
    names = [ep.value for ep in entry_points(group=PLUGIN_GROUP)]
    names += [n.strip() for n in os.environ.get(PLUGIN_ENV, "").split(",") if n.strip()]
    for name in names:
        if name in _loaded:
            continue
        light = HEAVY not in sys.modules
        try:
            _import(name)
        except Exception as exc:
            raise ConfigError(f"plug-in {name!r} failed to import: {type(exc).__name__}: {exc}") from exc
        _loaded.add(name)
        if light and HEAVY in sys.modules:
            log.warning("plug-in %s imports %s when it loads, so every config check loads it too (about 3 s "
                        "instead of 0.8 s); import heavy packages inside the functions that use them",
                        name, HEAVY)


def _import(name: str) -> None:
    """Import a module name, or a ``.py`` file as the module named by its stem (its directory joins
    ``sys.path`` and ``PYTHONPATH``, so a launcher's worker processes import it by the same name)."""
    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH", "")) if p)
    module = importlib.import_module(path.stem)
    if Path(module.__file__ or "").resolve() != path:
        raise ImportError(f"module name {path.stem!r} is taken by {module.__file__}; rename the plug-in file")
