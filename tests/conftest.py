"""Shared fixtures: no network, small threads, and a guard that tests write only to temporary dirs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHECKOUT = Path(__file__).resolve().parents[1]
RUN_ROOTS = ("outputs", "multirun")
"""Where ``marl`` makes run dirs by default (relative to the working dir: the checkout, under pytest)."""


def run_dirs() -> set[Path]:
    """The dirs up to three levels down the checkout's run roots (``outputs/<name>/<time>``,
    ``outputs/eval/<name>/<time>``, ``multirun/<name>/<time>``)."""
    return {p for root in RUN_ROOTS for depth in ("*", "*/*", "*/*/*") for p in (CHECKOUT / root).glob(depth)
            if p.is_dir()}


@pytest.fixture(scope="session", autouse=True)
def checkout_stays_clean() -> Iterator[None]:
    """Fail the session if a test made a run dir in the user's checkout instead of under ``tmp_path`` (give it
    ``hydra.run.dir`` / ``hydra.sweep.dir``; a resume writes into the run it resumes)."""
    before = run_dirs()
    yield
    gained = sorted(str(p.relative_to(CHECKOUT)) for p in run_dirs() - before)
    if gained:
        pytest.fail(f"tests wrote into the checkout: {', '.join(gained[:5])}", pytrace=False)
