"""Synthetic run directories for the ``marl report`` tests: just the files and keys the report reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def make_run(root: Path, rel: str, *, env: str = "plan_path", workflow: str = "single_agent",
             algorithm: str = "grpo", policy: str = "shared", steps: int = 10, seed: int = 0,
             lr: float = 1e-4, report: dict[str, Any] | None = None, overrides: list[str] | None = None,
             status: str | None = "completed", success: float | None = 0.5, before: float | None = None,
             summary: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
             metrics: list[dict[str, Any]] | None = None, write_config: bool = True) -> Path:
    """A run dir ``root/rel`` with .hydra/config.yaml, .hydra/overrides.yaml, summary.json (``status`` None:
    none) and metrics.jsonl (when ``metrics`` is given)."""
    run = root / rel
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {
        "env": {"name": env, "eval": {"source": "embedded"}} if env in ("math", "code", "research") else {"name": env},
        "workflow": {"name": workflow}, "algorithm": {"name": algorithm}, "policy": {"name": policy},
        "trainer": {"steps": steps, "learning_rate": lr, "resume": None, "frozen_roles": []},
        "logger": {"name": "none"}, "report": {"table": None, "method": None, "benchmark": None, "paper": None,
                                               "source": None, "before_method": None, **(report or {})},
        "name": "toy", "seed": seed, "progress": False, **(config or {}),
    }
    if write_config:
        OmegaConf.save(OmegaConf.create(cfg), run / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create([*(overrides or []), f"seed={seed}"]), run / ".hydra" / "overrides.yaml")
    if status is not None:
        data: dict[str, Any] = {"status": status, "command": "train", "name": "toy", "steps": steps,
                                "total_steps": steps, "env": env, "workflow": workflow, "algorithm": algorithm,
                                "regime": policy}
        if success is not None:
            data["eval/success"] = success
        if before is not None:
            data["eval_before/success"] = before
        data.update(summary or {})
        (run / "summary.json").write_text(json.dumps(data))
    if metrics is not None:
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run


def curve(steps: int = 4, roles: tuple[str, ...] = ("tool", "plan"), policy: str = "shared") -> list[dict[str, Any]]:
    """metrics.jsonl records of a short run: per-role reward and success, a policy namespace, eval points."""
    records: list[dict[str, Any]] = [{"step": 0, "eval_before/success": 0.2}]
    for step in range(1, steps + 1):
        record: dict[str, Any] = {"step": step, "train/reward": 0.1 * step, "train/success": 0.1 * step,
                                  f"train/{policy}/loss": 0.5 / step, f"train/{policy}/reward": 0.3}
        for i, role in enumerate(roles):
            record[f"train/{role}/reward"] = 0.1 * step + i
            record[f"train/{role}/success"] = min(1.0, 0.2 * step)
        records.append(record)
    records.append({"step": steps, "eval/success": 0.6})
    return records
