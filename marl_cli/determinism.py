"""``trainer.deterministic=true``: the same seed, config and machine give a bit-identical run.

Two halves. Before torch loads (``marl``'s entry point, from the command line's overrides): the environment
the native libraries read once, when they load — a fixed OpenMP/MKL thread count with dynamic teams off,
MKL's conditional numerical reproducibility (``MKL_CBWR``), oneDNN's strict float math, Python's hash seed —
set, then the process re-executes itself so that every one of them (the hash seed included) holds from its
first instruction. After torch loads (``build_run``): torch's own switches — the same thread count,
deterministic algorithms only, full-precision float32 matmuls. Nothing here imports torch at module level.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

OVERRIDE = "trainer.deterministic"
MARKER = "MARL_DETERMINISTIC"
"""Set (to the thread count) in the environment of a process that re-executed itself into the mode."""
TRUE = {"true", "yes", "on", "1"}


def deterministic_env(threads: int) -> dict[str, str]:
    """The variables native libraries read at load time, for a run on ``threads`` CPU threads."""
    return {
        "PYTHONHASHSEED": "0",  # str hashes, hence set iteration order, the same in every run
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "OMP_DYNAMIC": "FALSE", "MKL_DYNAMIC": "FALSE",  # no team shrunk under load: reductions split alike
        "MKL_CBWR": "AUTO",  # MKL's conditional numerical reproducibility: one code path, alignment-independent
        "KMP_DETERMINISTIC_REDUCTION": "TRUE",  # Intel OpenMP (where MKL brings it): reductions in a fixed order
        "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT",  # oneDNN never lowers float32 math to bf16/tf32
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # CUDA: cuBLAS deterministic (torch requires it with the switch)
        MARKER: str(threads),
    }


def thread_count(threads: int) -> int:
    """The fixed thread count: the ``threads`` setting, or every CPU this process may run on."""
    return threads or len(os.sched_getaffinity(0))


def _value(args: list[str], key: str) -> str | None:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+~") == key:
            return value
    return None


def requested(args: list[str]) -> bool:
    """Whether the command line's overrides switch the mode on (a sweep's ``true,false`` counts)."""
    value = _value(args, OVERRIDE)
    return value is not None and any(v.strip().lower() in TRUE for v in value.split(","))


def prepare(args: list[str]) -> None:
    """Called before torch loads: when ``args`` ask for the mode and this process was not started in it,
    set :func:`deterministic_env` and re-execute the same command line (``PYTHONHASHSEED`` is read only at
    interpreter start; the others at library load, which re-execution also makes sure comes after them)."""
    if not requested(args) or os.environ.get(MARKER):
        return
    threads = _value(args, "threads")
    os.environ.update(deterministic_env(thread_count(int(threads) if threads and threads.isdigit() else 0)))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def apply(threads: int) -> None:
    """Torch's half of the mode (call it before building models); warns when the process did not start in
    the mode (the mode set in a config file or from Python: MKL and the hash seed were already fixed)."""
    import torch

    count = thread_count(threads)
    if os.environ.get(MARKER) != str(count):
        log.warning("%s=true but this process did not start with its environment (pass %s=true on the "
                    "command line): threads and torch's switches are set, MKL_CBWR and PYTHONHASHSEED are not",
                    OVERRIDE, OVERRIDE)
    torch.set_num_threads(count)
    torch.use_deterministic_algorithms(True)
    torch.backends.mkldnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
