"""``marl env``: the versions, devices and tools of this machine, to paste into a bug report."""

from __future__ import annotations

import sys

from marl_cli.provenance import environment


def run(args: list[str]) -> None:
    if args:
        print(f"marl env: error: takes no arguments, got {' '.join(args)}", file=sys.stderr)
        sys.exit(2)
    for key, value in environment().items():
        print(f"{key + ':':<16}{value if value is not None else 'not installed'}")
