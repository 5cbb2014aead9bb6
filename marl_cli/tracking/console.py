"""The console: progress bars where a terminal draws them, one plain line per step everywhere else."""

from __future__ import annotations

import sys
from typing import TextIO


def draws_bars(progress: bool, main: bool = True, stream: TextIO | None = None) -> bool:
    """Whether to show progress bars: ``progress=true``, on rank 0, and tqdm's stream (stderr) a terminal.

    Piped or redirected to a file, a bar is a run of frames joined by carriage returns; there the training
    loop writes one plain line per step instead (``training.hooks.step_line``).
    """
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(progress and main and isatty is not None and isatty())
