"""Progress bars only where a terminal draws them; a piped run prints plain lines and no third-party noise."""

from __future__ import annotations

import io

from marl_cli.tracking.console import draws_bars
from tests.helpers import FAST, cli


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_need_progress_rank_zero_and_a_terminal():
    assert draws_bars(True, True, Terminal())
    assert not draws_bars(False, True, Terminal())
    assert not draws_bars(True, False, Terminal())
    assert not draws_bars(True, True, io.StringIO())  # a pipe or a file
    assert not draws_bars(True, True, object())  # a stream that cannot tell


def test_a_piped_logger_none_run_prints_plain_step_lines(tmp_path):
    run = tmp_path / "run"
    out = cli("train", *FAST, "trainer.steps=2", "progress=true", f"hydra.run.dir={run}")  # WANDB_MODE=offline
    assert out.returncode == 0, out.stderr[-2000:]
    printed = out.stdout + out.stderr
    assert "wandb" not in printed.lower(), [line for line in printed.splitlines() if "wandb" in line.lower()]
    assert "\r" not in printed
    assert [line.split("] - ")[1].split(" |")[0] for line in out.stdout.splitlines()
            if "] - step " in line] == ["step 1/2", "step 2/2"]
    assert not (run / "wandb").exists()
