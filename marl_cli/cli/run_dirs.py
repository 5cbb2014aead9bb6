"""One run per run directory: a Hydra callback that runs before Hydra writes anything into the run (or sweep) dir.

A time-stamped dir (the default ``outputs/<name>/<date>_<time>``) is claimed by creating it, so two runs started in
the same second get two dirs (the second ends in ``_2``). A dir the command line or a config fixes
(``hydra.run.dir=D``) is refused, in one line and before any work, when it holds another run: its metrics,
samples or checkpoints, or a config that differs from this run's. A resume continues in the dir it resumes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from marl_cli.config.launch import launched_rank

RUN_OUTPUTS = ("metrics.jsonl", "samples.jsonl", "checkpoints", "published")
"""What a run dir holds once its run has measured, sampled or saved anything."""
SWEEP_OUTPUTS = ("multirun.yaml", "optimization_results.yaml")
"""What a sweep dir holds once its sweep has started."""


def claim(key: str, config: DictConfig, refusal: Callable[[Path], str]) -> None:
    """Make ``config``'s dir at ``key`` (``hydra.run.dir``) this run's: a fresh time-stamped dir (renamed with a
    suffix if another run made it first), or the fixed dir unless ``refusal(dir)`` names another run there."""
    if launched_rank() != 0:
        return  # every rank shares rank 0's dir; rank 0 checks it
    value = str(OmegaConf.select(config, key))
    where = Path(value).absolute()
    if not stamped(config, key):
        reason = refusal(where)
        if reason:
            from marl_cli.cli.app import fail

            fail(config.hydra.job.name, reason)
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = where if n == 1 else where.with_name(f"{where.name}_{n}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        if candidate != where:
            with read_write(config):
                OmegaConf.update(config, key, str(candidate) if Path(value).is_absolute()
                                 else os.path.relpath(candidate))
        return


def stamped(config: DictConfig, key: str) -> bool:
    """Whether the dir at ``key`` is named by the time the run starts (``${now:...}``), before resolving it."""
    parent, _, leaf = key.rpartition(".")
    return "${now:" in str(OmegaConf.to_container(OmegaConf.select(config, parent), resolve=False)[leaf])


def task_yaml(config: DictConfig) -> str:
    """The run's config as Hydra writes it to ``.hydra/config.yaml``: the whole config less its ``hydra`` node."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return OmegaConf.to_yaml(task)


def other_run(where: Path, config: DictConfig) -> str:
    """Why ``where`` holds another run than the one ``config`` starts ('' if it does not)."""
    resume = OmegaConf.select(config, "trainer.resume")
    if resume and Path(str(resume)).absolute().resolve() == where.resolve():
        return ""
    found = [name for name in RUN_OUTPUTS if (where / name).exists()]
    saved = where / ".hydra" / "config.yaml"
    if saved.is_file() and saved.read_text() != task_yaml(config):
        found.append("a different config in .hydra/")
    if not found:
        return ""
    return (f"hydra.run.dir={where} holds another run ({', '.join(found)}); continue that run with "
            f"trainer.resume={where}, or give another hydra.run.dir to start afresh")


def other_sweep(where: Path) -> str:
    """Why ``where`` holds another sweep ('' if it does not)."""
    found = [name for name in SWEEP_OUTPUTS if (where / name).exists()]
    found += [f"{p.name}/" for p in sorted(where.iterdir()) if p.is_dir()][:3] if where.is_dir() else []
    if not found:
        return ""
    return f"hydra.sweep.dir={where} holds another sweep ({', '.join(found)}); give another hydra.sweep.dir"


class OneRunPerDir(Callback):
    """Hydra callback (``hydra.callbacks`` in ``conf/groups.yaml``): claims the run or sweep dir before Hydra
    writes ``.hydra/`` there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        claim("hydra.run.dir", config, lambda where: other_run(where, config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        claim("hydra.sweep.dir", config, other_sweep)
