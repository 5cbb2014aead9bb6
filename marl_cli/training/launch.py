"""How many processes a launcher (``torchrun``, ``accelerate launch``) started for this run, read without
importing torch, so the command line can check a config before anything heavy loads."""

from __future__ import annotations

import os


def launched_world_size() -> int:
    """The launcher's ``WORLD_SIZE`` (1 when the run was not started by torchrun or accelerate)."""
    return int(os.environ.get("WORLD_SIZE", "1"))
