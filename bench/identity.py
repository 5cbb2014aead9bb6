"""Bit-identity of behaviour across a refactor: short deterministic runs of each kind of training, hashed.

Each run is ``marl train`` as a user starts it (``trainer.deterministic=true``, a fresh process, the tiny model,
a few steps), into a temporary run dir. Its fingerprint is the SHA-256 of its metrics (every field of
``metrics.jsonl`` but the wall-clock ones: ``time/*`` and seconds, ``*_s``) and of its final checkpoint's weights
(every ``*.safetensors`` file of every policy, in path order). Two commits whose reports agree train the same
bits on this machine.

Usage: ``make identity`` (``python bench/identity.py --out bench/identity.json``); ``--compare OLD.json`` exits 1
naming every run whose fingerprint differs from ``OLD.json``'s; ``--only NAME`` runs one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHORT = ["trainer.deterministic=true", "progress=false", "logger=none", "trainer.eval_every=0",
         "trainer.warmstart.cache=null", "trainer.warmstart.num_examples=100", "trainer.warmstart.epochs=1"]
"""Every run: deterministic, no evaluation, a short warm start trained afresh (no cache shared between commits)."""
VALUES = ["trainer.steps=2", "trainer.save_every=2", "rollout.tasks_per_step=8"]
RUNS: dict[str, list[str]] = {
    "embedded": ["experiment=embedded", "trainer.steps=3", "trainer.save_every=3", "env.eval_size=10"],
    "ppo": ["experiment=toy/values/plan_path_ppo", *VALUES],
    "marft": ["experiment=toy/values/plan_path_marft_team", *VALUES],
    "archer": ["experiment=toy/values/plan_path_archer", *VALUES],
    "async_k1": ["experiment=toy/table/plan_path_at_grpo_shared", "algorithm.mode=independent",
                 "trainer.max_staleness=1", "trainer.steps=3", "trainer.save_every=3", "rollout.tasks_per_step=8"],
    "hetero_team": ["experiment=toy/table/plan_path_hetero", *VALUES],
    "epo": ["experiment=toy/credit/plan_path_epo", *VALUES],
}
"""Each kind of training whose bits a refactor must keep: the embedded default run, a critic run of each
value-based algorithm, asynchronous rollouts one step off, a team of two different models, and a loss term."""
TIMING = ("time/",)
"""Wall-clock metrics: under ``time/``, and any key in seconds (``_s``: ``async/wait_s``)."""


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def fingerprint(run: Path) -> dict[str, str]:
    """The SHA-256 of the run's metrics (wall-clock fields left out) and of its final checkpoint's weights."""
    metrics = [{k: v for k, v in json.loads(line).items()
                if not k.startswith(TIMING) and not k.endswith(("_s", "/cached"))}
               for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = sorted((run / "checkpoints").glob("step_*"))[-1]
    weights = sorted((final / "policies").rglob("*.safetensors"))
    return {"metrics": hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest(),
            "weights": digest(weights), "checkpoint": final.name, "weight_files": str(len(weights))}


def train(name: str, overrides: list[str], workdir: Path) -> dict[str, str]:
    run = workdir / name
    exe = Path(sys.executable).with_name("marl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    started = time.perf_counter()
    done = subprocess.run([str(exe), "train", *overrides, *SHORT, f"hydra.run.dir={run}"], capture_output=True,
                          text=True, env=env, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"identity: run {name} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return {**fingerprint(run), "wall_s": f"{time.perf_counter() - started:.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/identity.json"))
    parser.add_argument("--compare", type=Path, help="an earlier report: exit 1 if any fingerprint differs")
    parser.add_argument("--only", action="append", choices=sorted(RUNS), help="run these only (repeatable)")
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or RUNS:
            report[name] = train(name, RUNS[name], Path(tmp))
            print(f"{name}: metrics {report[name]['metrics'][:12]} weights {report[name]['weights'][:12]} "
                  f"({report[name]['wall_s']} s)", flush=True)
    args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    if args.compare:
        old = json.loads(args.compare.read_text())
        differ = [name for name in report if name in old and
                  (old[name]["metrics"], old[name]["weights"]) != (report[name]["metrics"], report[name]["weights"])]
        if differ:
            raise SystemExit(f"identity: {', '.join(differ)} differ from {args.compare}")
        print(f"identity: every run matches {args.compare}")


if __name__ == "__main__":
    main()
