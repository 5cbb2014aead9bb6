"""How many processes a launcher (``torchrun``, ``accelerate launch``) started for this run, and which one this is,
read without importing torch, so the command line can check a config before anything heavy loads."""

from __future__ import annotations

import os


def launched_world_size() -> int:
    """The launcher's ``WORLD_SIZE`` (1 when the run was not started by torchrun or accelerate)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's ``RANK`` among the launcher's processes (0 when the run was not started by a launcher)."""
    return int(os.environ.get("RANK", "0"))
