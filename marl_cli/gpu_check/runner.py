"""Running checks into rows: each in a process of its own (``python -m marl_cli.gpu_check.runner <check> <setup>``,
in a session of its own), so a hang becomes a fail row at the timeout (the whole session killed, the processes it
started too), each starts with a fresh device (one check's memory is not the next one's peak) and an engine's memory
goes with its process; or in this process (tests). A failing check fails its row, never the others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from marl_cli.gpu_check.checks import CHECKS, Setup, Skip, resolve
from marl_cli.gpu_check.table import Row, one_line

MARK = "marl-gpu-check-row "
"""Starts the line on which a check's process prints its row as JSON."""
TAIL = 4000
"""Characters of a dead check process's output searched for the line that says why."""


def run_check(name: str, setup: Setup, check: Callable[[Setup], dict[str, Any]] | None = None) -> Row:
    """Check ``name`` (its registered function unless ``check``) in this process, as a row: pass with its figures,
    skip or fail with the one line its exception says."""
    start = time.perf_counter()
    try:
        figures = (check or resolve(name))(setup)
    except Skip as exc:
        return Row(name, "skip", seconds=time.perf_counter() - start, reason=one_line(str(exc)))
    except Exception as exc:  # any failure is the row's, not the table's
        reason = one_line(f"{type(exc).__name__}: {exc}")
        return Row(name, "fail", seconds=time.perf_counter() - start, reason=reason)
    return Row(name, "pass", figures, time.perf_counter() - start)


def run_isolated(name: str, setup: Setup, timeout: float) -> Row:
    """Check ``name`` in a process of its own (offline: nothing downloads), killed with everything it started after
    ``timeout`` seconds."""
    command = [sys.executable, "-m", "marl_cli.gpu_check.runner", name, json.dumps(asdict(setup))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Row(name, "fail", seconds=time.perf_counter() - start, reason=f"timed out after {timeout:g} s")
    rows = [line[len(MARK):] for line in output.splitlines() if line.startswith(MARK)]
    if rows:
        return Row(**json.loads(rows[-1]))
    return Row(name, "fail", seconds=time.perf_counter() - start, reason=died(process.returncode, output))


def died(code: int, output: str) -> str:
    """Why a check's process ended without a row: the last error line of its output, with its exit code."""
    lines = [line.strip() for line in output[-TAIL:].splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines else "")
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return one_line(f"the check's process died ({how}): {error}")


def run_checks(names: list[str], setup: Setup, timeout: float, isolate: bool = True,
               report: Callable[[int, Row], None] | None = None) -> list[Row]:
    """The rows of ``names`` in ``CHECKS``' order, each reported to ``report`` (its index, the row) when done."""
    rows = []
    for name in [n for n in CHECKS if n in names]:
        row = run_isolated(name, setup, timeout) if isolate else run_check(name, setup)
        rows.append(row)
        if report is not None:
            report(len(rows), row)
    return rows


def main(argv: list[str]) -> None:
    """A check's process: run it, print its row (``MARK`` + JSON) and end at once (an engine's or a process
    group's teardown at exit could hang past the row)."""
    name, setup = argv[0], Setup(**json.loads(argv[1]))
    row = run_check(name, setup)
    print(MARK + json.dumps(asdict(row), default=str), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
