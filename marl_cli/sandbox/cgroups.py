"""A memory limit per sandbox run (all its processes together), through the memory cgroup.

Where this process may create cgroups (root, and a writable memory controller: cgroup v1, or v2 with the
memory controller delegated), each concurrent run slot of a sandbox gets
``<own cgroup>/marl-sandbox-<pid>-<sandbox>/slot<N>`` with ``memory_mb`` as its limit (swap included where
the kernel accounts it), and a run enters its slot's cgroup before exec, so every process it starts is
counted together. Elsewhere ``MemoryCgroups.create``
returns None and the per-process address-space limit (RLIMIT_AS) is the only memory limit.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
_SANDBOXES = itertools.count()


def _memory_cgroup() -> tuple[Path, bool] | None:
    """This process's memory cgroup dir and whether it is cgroup v2; None when there is none."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        parts, extra = fields.split(), rest.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        root, mount, fstype, options = parts[3], parts[4], extra[0], extra[2].split(",")
        if fstype == "cgroup" and "memory" in options:
            path = next((entry.split(":", 2)[2] for entry in own if "memory" in entry.split(":", 2)[1].split(",")),
                        None)
            version2 = False
        elif fstype == "cgroup2":
            path = next((entry.split(":", 2)[2] for entry in own if entry.startswith("0::")), None)
            version2 = True
        else:
            continue
        if path is None:
            continue
        here = Path(mount) / os.path.relpath(path, root).lstrip("./")
        if version2 and "memory" not in (here / "cgroup.controllers").read_text().split():
            continue
        return here, version2
    return None


class MemoryCgroups:
    """One cgroup per run slot under ``root``, each limited to ``limit`` bytes; removed at exit."""

    def __init__(self, root: Path, version2: bool, limit: int):
        self.root, self.version2, self.limit = root, version2, limit
        self.slots: dict[int, Path] = {}
        atexit.register(self.close)

    @classmethod
    def create(cls, limit: int) -> MemoryCgroups | None:
        """Cgroups for runs of ``limit`` bytes each, or None where this process cannot make them."""
        if os.geteuid() != 0:
            return None
        found = _memory_cgroup()
        if found is None:
            return None
        parent, version2 = found
        root = parent / f"marl-sandbox-{os.getpid()}-{next(_SANDBOXES)}"  # each sandbox its own limits
        try:
            root.mkdir(exist_ok=True)
            if version2:
                (root / "cgroup.subtree_control").write_text("+memory")
            cgroups = cls(root, version2, limit)
            cgroups.procs(0)  # a first slot proves the limits can be written
        except OSError as exc:
            log.debug("no per-run memory cgroups (%s)", exc)
            with contextlib.suppress(OSError):
                root.rmdir()
            return None
        return cgroups

    def procs(self, slot: int) -> str:
        """The ``cgroup.procs`` file a run in ``slot`` writes its pid to (the slot's cgroup made on first use)."""
        if slot not in self.slots:
            path = self.root / f"slot{slot}"
            path.mkdir(exist_ok=True)
            if self.version2:
                (path / "memory.max").write_text(str(self.limit))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(self.limit))
                with contextlib.suppress(OSError):  # only where swap is accounted
                    (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
            self.slots[slot] = path
        return str(self.slots[slot] / "cgroup.procs")

    def close(self) -> None:
        for path in [*self.slots.values(), self.root]:
            with contextlib.suppress(OSError):
                path.rmdir()
        self.slots.clear()
