"""``python -m marl_cli.cli.reference [--out PATH]`` (``make reference``): write the config reference
(``docs/reference/config.md``) from the schemas of the groups and of marl's built-in plug-ins."""

from __future__ import annotations

from marl_cli.config.reference import main
from marl_cli.plugins import load_builtin

if __name__ == "__main__":
    load_builtin()
    main()
