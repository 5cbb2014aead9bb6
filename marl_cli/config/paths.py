"""Locating the ``conf/`` directory in a source checkout or an installed wheel, and the user's own config dirs."""

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


def config_dirs_in(args: list[str]) -> list[str]:
    """The user's config dirs named by ``--config-dir``/``-cd`` (searched after marl's own ``conf/``)."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("-cd", "--config-dir") and i + 1 < len(args):
            dirs.append(args[i + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
    return [str(Path(d).expanduser().resolve()) for d in dirs]
