"""Progress bars only where a terminal draws them."""

from __future__ import annotations

import io

from marl_cli.tracking.console import draws_bars


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_need_progress_rank_zero_and_a_terminal():
    assert draws_bars(True, True, Terminal())
    assert not draws_bars(False, True, Terminal())
    assert not draws_bars(True, False, Terminal())
    assert not draws_bars(True, True, io.StringIO())  # a pipe or a file
    assert not draws_bars(True, True, object())  # a stream that cannot tell
