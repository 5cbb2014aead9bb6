"""Where metrics go: ``metrics.jsonl`` always, Weights & Biases when ``logger=wandb``, and ``summary.json``."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    return float(value) if hasattr(value, "item") else value


SECRET_KEYS = ("api_key", "password", "token")
"""Config keys whose values never leave the machine (W&B gets ``***``)."""


def redacted(config: Any) -> Any:
    """``config`` (plain dicts and lists) with the values of secret keys replaced by ``***`` when set."""
    if isinstance(config, dict):
        return {k: "***" if k in SECRET_KEYS and v else redacted(v) for k, v in config.items()}
    if isinstance(config, list):
        return [redacted(v) for v in config]
    return config


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a crash never leaves a half-written file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_jsonable) + "\n")
    os.replace(tmp, path)


WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_mode(requested: str) -> str:
    """``auto`` follows ``WANDB_MODE`` if set, else online when credentials exist (env var or netrc), else offline."""
    if requested not in WANDB_MODES:
        raise ConfigError(f"logger.mode={requested!r} is unknown; choose from: {', '.join(WANDB_MODES)}")
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE") in WANDB_MODES[1:]:
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return "online" if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore") else "offline"


def wandb_identity(run_dir: Path, name: str, logger_cfg: Any, job_type: str) -> dict[str, Any]:
    """The W&B run's name, group, job type and tags: a sweep job (``.../<overrides>/seed=<n>``) is named by
    its overrides and seed and grouped with its seed repeats; ``logger.run_name``/``logger.group`` win."""
    setup = run_dir.parent.name if run_dir.name.startswith("seed=") else None
    job = f"{setup}/{run_dir.name}" if setup else run_dir.name
    return {"name": logger_cfg.get("run_name") or f"{name}/{job}",
            "group": logger_cfg.get("group") or (f"{name}/{setup}" if setup else name),
            "job_type": job_type, "tags": list(dict.fromkeys([*logger_cfg.tags, name]))}


class Tracker:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and mirrors it to W&B.

    Args:
        run_dir: the run directory.
        logger_cfg: the ``logger`` config (``name`` is ``wandb`` or ``none``).
        config: the resolved run config, stored with the W&B run (secret values redacted).
        job_type: the W&B job type (``train`` or ``eval``).
        writes: False on the processes of a multi-process run other than rank 0: they log nothing.
    """

    def __init__(self, run_dir: Path, logger_cfg: Any, config: dict[str, Any], job_type: str = "train",
                 writes: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self.wandb = None
        self.writes = writes
        if logger_cfg.name == "wandb" and writes:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            mode = wandb_mode(logger_cfg.mode)
            self.wandb = wandb.init(project=logger_cfg.project, entity=logger_cfg.entity, dir=str(run_dir),
                                    config=redacted(config), mode=mode, resume="allow", id=_wandb_id(run_dir),
                                    **wandb_identity(run_dir, config.get("name", "marl"), logger_cfg, job_type))
            if mode == "offline":  # W&B itself is silenced: say where the run went and how to upload it
                offline = Path(self.wandb.dir).parent
                log.info("W&B: offline run in %s; upload it with: wandb sync %s", offline, offline)
        elif logger_cfg.name != "none":
            raise ConfigError(f"logger.name={logger_cfg.name!r} is unknown; choose from: wandb, none")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.writes:
            return
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def log_samples(self, step: int, records: list[dict[str, Any]], table: str) -> None:
        """Append readable completions to ``samples.jsonl`` and, with W&B, as the table ``table``."""
        if not records or not self.writes:
            return
        with (self.path.parent / "samples.jsonl").open("a") as f:
            for record in records:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        if self.wandb is not None:
            import wandb

            columns = list(dict.fromkeys(c for r in records for c in r))  # rows of other roles may lack some
            rows = [[r.get(c) for c in columns] for r in records]
            self.wandb.log({table: wandb.Table(columns=columns, data=rows)}, step=step)

    def forget_after(self, step: int) -> int:
        """Drop the records of steps after ``step`` from ``metrics.jsonl`` and ``samples.jsonl`` (a resume from
        the checkpoint of ``step`` trains them again, so each step is logged once); return how many went."""
        dropped = 0
        for path in (self.path, self.path.parent / "samples.jsonl"):
            if not self.writes or not path.exists():
                continue
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
            dropped += len(lines) - len(kept)
            if len(kept) < len(lines):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(kept))
                os.replace(tmp, path)
        return dropped

    def finish(self, summary: dict[str, Any]) -> None:
        if self.wandb is not None:
            self.wandb.summary.update({k: v for k, v in summary.items() if isinstance(v, int | float | str)})
            self.wandb.finish()


def _wandb_id(run_dir: Path) -> str:
    """One W&B run per run dir, so a resumed run continues the same W&B run."""
    id_file = run_dir / ".wandb_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip()


class LogFile:
    """Copies marl's log lines (steps, evals, checkpoints, resumes) to ``path``, e.g. ``<run>/train.log``.

    Nothing is added when a handler already writes there (Hydra's job log of a ``marl train`` run dir);
    a resumed run's own dir, or a run started in-process, gets its own handler until ``close``; no
    ``path`` (the processes of a multi-process run other than rank 0) adds nothing.
    """

    def __init__(self, path: Path | None):
        self.logger = logging.getLogger("marl_cli")
        self.handler: logging.Handler | None = None
        if path is None:
            return
        target = path.resolve()
        every = [*logging.getLogger().handlers, *self.logger.handlers]
        if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == target for h in every):
            return
        self.handler = logging.FileHandler(target)
        self.handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        self.handler.setLevel(logging.INFO)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)

    def close(self) -> None:
        if self.handler is not None:
            self.logger.removeHandler(self.handler)
            self.handler.close()

