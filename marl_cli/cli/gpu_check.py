"""``marl gpu-check``: tiny-model checks of every GPU path on this machine's CUDA devices, one process each, printed
as one table (check | result | figures | seconds) and written as JSON (``--out``) and Markdown beside it (headed
with the date and the card, to paste into the docs). Without CUDA it says so in one line and exits 0;
``--device cpu`` runs the checks' CPU stand-ins. Exits 1 when a check fails."""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marl_cli.gpu_check.checks import CHECKS, Setup
from marl_cli.gpu_check.table import Row, text_table, write
from marl_cli.provenance import git_sha, version

DEFAULT_OUT = Path("gpu_check.json")
DEFAULT_TIMEOUT = 300.0
CPU_PROCESSES = 2
"""Processes the multi-process checks start on the CPU (gloo stand-ins for NCCL)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="marl gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=list(CHECKS), metavar="CHECK",
                   help=f"run this check (repeatable; default all): {', '.join(CHECKS)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"the JSON file (default {DEFAULT_OUT}); the Markdown goes beside it (.md)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds one check may take before its row fails (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="default: cuda where there is one, else nothing to check; cpu: the checks' CPU stand-ins")
    return p


def no_cuda(torch: Any) -> str:
    """The one line ``marl gpu-check`` prints without a CUDA device."""
    runtime = torch.version.cuda or "none"
    return (f"no CUDA device: nothing to check (torch {torch.__version__}, CUDA runtime {runtime}, "
            f"{torch.cuda.device_count()} GPUs visible); `marl gpu-check --device cpu` runs the CPU stand-ins")


def setup_for(device: str, workdir: str) -> Setup:
    """The setup the checks run with on ``device``: every GPU (bf16 where the card has it), or 2 CPU processes."""
    import torch

    if device == "cpu":
        return Setup("cpu", CPU_PROCESSES, "bfloat16", workdir)
    dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return Setup("cuda", torch.cuda.device_count(), dtype, workdir)


def machine(rows: list[Row], setup: Setup) -> dict[str, Any]:
    """The date, the card and the versions the rows ran on (the device check's figures where it ran)."""
    found = next((row.figures for row in rows if row.check == "device" and row.status == "pass"), {})
    card = f"{found['gpu']} × {found['count']}" if "gpu" in found else f"{setup.device} × {setup.devices}"
    out = {"date": datetime.date.today().isoformat(), "card": card, "marl": version(), "commit": git_sha()}
    out.update({key: found[key] for key in ("torch", "cuda", "driver") if key in found})
    return out


def progress(total: int) -> Callable[[int, Row], None]:
    """Prints each row as it comes (``[i/total] check: result (seconds)``) on stderr."""

    def report(index: int, row: Row) -> None:
        print(f"[{index}/{total}] {row.check}: {row.result} ({row.seconds:.1f} s)", file=sys.stderr, flush=True)

    return report


def run(args: list[str]) -> None:
    """``marl gpu-check [--only CHECK]... [--out FILE] [--timeout S] [--device cuda|cpu]``."""
    options = parser().parse_args(args)
    import torch

    if options.device is None and not torch.cuda.is_available():
        print(no_cuda(torch))
        return
    if options.device == "cuda" and not torch.cuda.is_available():
        print(f"marl gpu-check: error: {no_cuda(torch).split(':')[0]}", file=sys.stderr)
        sys.exit(2)
    from marl_cli.gpu_check.runner import run_checks

    with tempfile.TemporaryDirectory(prefix="marl-gpu-check-") as workdir:
        setup = setup_for(options.device or "cuda", workdir)
        names = [name for name in CHECKS if name in (options.only or CHECKS)]
        rows = run_checks(names, setup, options.timeout, report=progress(len(names)))
    print(text_table(rows))
    json_path, md_path = write(rows, machine(rows, setup), options.out)
    print(f"\nwritten: {json_path}, {md_path}")
    if any(row.status == "fail" for row in rows):
        sys.exit(1)
