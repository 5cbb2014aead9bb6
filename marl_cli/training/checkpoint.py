"""Checkpoints: each policy's weights (HF format) plus optimiser, scheduler and RNG state.

Layout: ``<run>/checkpoints/step_<N>/policies/<policy>/``, ``<run>/checkpoints/step_<N>/state.pt`` and
``manifest.json`` (the size and SHA-256 of every file). LoRA policies store only their adapter; their
frozen base stays in ``<run>/lora_base`` (a base of another model config in ``<run>/lora_base_<policy>``).
A checkpoint is written to a temporary directory and renamed, so a crash never leaves a partial one;
``trainer.save_total_limit`` deletes the oldest ones after each save. A resume (and ``marl eval load=<run>``)
checks the newest checkpoint against its manifest and falls back to the newest intact one, with a warning
naming the damaged ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marl_cli.config.errors import ConfigError
from marl_cli.policies.regime import Policy

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
MOVED = {"marl_cli.rollout.samples": "marl_cli.core.samples"}
"""Modules whose classes older checkpoints pickled (rows in flight, replay buffers) under another name."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


RNGS = ("python_rng", "torch_rng", "cuda_rng")
"""The random generators' states a checkpoint holds beside the parts."""


@dataclass
class RunState:
    """What a checkpoint holds beside the policies' weights: its step and each component's part, by name. When the
    loop saves, each component adds its own (``trainers``: the optimiser, scheduler and loss states by policy;
    ``critics``; ``in_flight``: rows rollout workers played for later steps; ``extra``: the loop's counters); on a
    resume each reads its own back from ``load_state``'s dict under the same name."""

    step: int
    parts: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, part: Any) -> None:
        """File ``part`` under ``name``; a name taken (by another part, ``step`` or an RNG) is a ValueError."""
        if name in self.parts or name in ("step", *RNGS):
            raise ValueError(f"a checkpoint part named {name!r} is already there")
        self.parts[name] = part


def save_checkpoint(run_dir: Path, state: RunState, policies: dict[str, Policy], rng: random.Random,
                    weights: dict[str, dict[str, torch.Tensor]] | None = None,
                    write: Callable[[Path], None] | None = None) -> Path:
    """Write the checkpoint of ``state.step`` (its parts, the policies' weights and the RNGs: ``rng`` and torch's)
    and return its directory; ``weights`` by policy name replace what a policy's model holds (a sharded learner's
    fp32 masters); ``write`` adds files of its own to the directory (a learned reward model's weights)."""
    final = checkpoint_dir(run_dir, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, policy in policies.items():
        policy.save(tmp / "policies" / name, (weights or {}).get(name))
    tmp.mkdir(parents=True, exist_ok=True)
    if write is not None:
        write(tmp)
    torch.save({"step": state.step, **state.parts, "python_rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}, tmp / "state.pt")
    (tmp / MANIFEST).write_text(json.dumps(manifest(tmp), indent=1, sort_keys=True))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def prune_checkpoints(run_dir: Path, saved: Path, keep: int | None) -> list[Path]:
    """After ``saved`` was written, delete the oldest checkpoints so that ``keep`` remain (None: keep all).

    Only checkpoints older than ``saved`` go: ``saved`` (what a resume now takes) always stays, and newer
    ones (damaged ones a resume skipped) are left alone. Returns the deleted directories.
    """
    if keep is None:
        return []
    older = sorted(p for p in (run_dir / "checkpoints").glob("step_*")
                   if not p.name.endswith(".tmp") and p.name < saved.name)
    doomed = older[:max(len(older) - (keep - 1), 0)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def manifest(directory: Path) -> dict[str, list]:
    """``[size, sha256]`` of every file under ``directory`` (but the manifest), by relative path."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[str(path.relative_to(directory))] = [path.stat().st_size, digest.hexdigest()]
    return out


def damage(checkpoint: Path) -> str | None:
    """What is wrong with ``checkpoint`` against its manifest (None: intact; a checkpoint written before
    manifests existed is taken as intact)."""
    path = checkpoint / MANIFEST
    if not path.exists():
        return None if (checkpoint / "state.pt").exists() else "no state.pt"
    try:
        expected = json.loads(path.read_text())
    except ValueError:
        return f"unreadable {MANIFEST}"
    found = manifest(checkpoint)
    for name, (size, digest) in expected.items():
        if name not in found:
            return f"{name} is missing"
        if found[name] != [size, digest]:
            return f"{name} differs from its manifest ({found[name][0]} of {size} bytes)"
    return None


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest intact checkpoint of ``run_dir`` (damaged newer ones are skipped with a warning); a clear
    error when there is none."""
    if not run_dir.is_dir():
        raise ConfigError(f"trainer.resume={run_dir}: no such run directory")
    done = sorted((p for p in (run_dir / "checkpoints").glob("step_*") if not p.name.endswith(".tmp")), reverse=True)
    if not done:
        raise ConfigError(f"trainer.resume={run_dir}: the run has no checkpoint under checkpoints/")
    for checkpoint in done:
        problem = damage(checkpoint)
        if problem is None:
            return checkpoint
        log.warning("checkpoint %s is damaged (%s); trying the one before it", checkpoint.name, problem)
    raise ConfigError(f"trainer.resume={run_dir}: every checkpoint under checkpoints/ is damaged")


class _Unpickler(pickle.Unpickler):
    """Finds a class an older checkpoint pickled under a module that has since moved (``MOVED``)."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED.get(module, module), name)


class _pickle:
    """``pickle`` with the unpickler that follows moved modules."""

    Unpickler = _Unpickler
    load = pickle.load


def load_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's ``state.pt`` (one saved before a module moved included)."""
    return torch.load(checkpoint / "state.pt", weights_only=False, pickle_module=_pickle)
