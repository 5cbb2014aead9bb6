"""Locating the ``conf/`` directory in a source checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

from marl_cli.config.errors import ConfigError


def config_dir() -> Path:
    """``marl_cli/conf`` in a wheel (packed there at build time), else the checkout's ``conf/``."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise ConfigError(f"cannot find marl's conf/ directory next to {package}; reinstall the package")
