"""Stopping a run between steps: SIGINT (Ctrl-C) and SIGTERM (``kill``, SLURM preemption) during a step let
the step finish, so the checkpoint written on the way out holds only completed steps.

A first signal during a step asks the loop to stop after it; a second one stops at once and nothing is
saved from the half-done step (the newest checkpoint stands). Outside a step (warm start, evaluation
before training) a signal stops at once, as Python's default Ctrl-C does.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context that turns SIGINT/SIGTERM into ``requested`` while ``in_step`` (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self.in_step = False
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.in_step and not self.requested:
            self.requested = True
            log.warning("%s: finishing this step, then saving a checkpoint and stopping (again to stop now, "
                        "without saving this step)", signal.Signals(signum).name)
            return
        raise KeyboardInterrupt
