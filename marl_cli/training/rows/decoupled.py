"""Decoupled M-GRPO: the main and the sub trainer as two processes that meet only in the store.

``trainer.role=main`` rolls out with both policies and trains the main agent. Right after the
rollout of step s it writes every sub-trajectory (key ``<step>/<task>/<branch>/<role>/<segment>``)
to stream ``sub/<s>``, in one transaction with the record ``step/<s>`` (the step's rollouts and item
count); a step already in the store (a restarted main) is not written again. Before rolling out it
loads the sub policy's newest published weights, waiting until they are at least version max(0, s − 1 − k)
(``trainer.max_staleness=k``; 0: the sub trainer has trained on every earlier step). The sub rows record the
version they were sampled from (``Sample.policy_version``), so the sub trainer's rows are at most k updates
old: the same bound, per row, as the rollout worker's, from the same rule (``core/staleness.py``).

``trainer.role=sub`` takes the steps in order: waits for ``step/<s>``, reads the stream's items its
consumer has not acknowledged, recomputes their rewards (the workflow's sub reward), aligns them
and computes advantages, updates the sub policy, publishes its weights as version s (record
``weights``), and acknowledges a step's items only once a checkpoint holds the update. A sub
trainer killed and resumed from its last checkpoint therefore re-reads exactly the steps that
checkpoint lacks: no trajectory is lost and none is counted twice.

A trainer waiting longer than a few seconds for the other logs what it waits for (the step or weights
version, the record, the store) every 30 s (``Store.wait``); a step that leaves the sub trainer nothing to
train on is logged as a warning and counted (``train/<policy>/skipped_steps``, see ``Trainer.nothing_to_train``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.core.samples import COMPUTED, Sample
from marl_cli.core.staleness import Staleness
from marl_cli.policies.regime import Policy
from marl_cli.store import Store

log = logging.getLogger(__name__)
CONSUMER = "sub"
WEIGHTS = "weights"
KEEP_VERSIONS = 3


def to_item(rows: list[Sample]) -> dict[str, Any]:
    return {"rows": [{k: v for k, v in vars(s).items() if k not in COMPUTED} for s in rows]}


def from_item(item: dict[str, Any]) -> list[Sample]:
    return [Sample(**row) for row in item["rows"]]


class Exchange:
    """One decoupled trainer's side of the store: what main writes and sub reads, and the weights between them."""

    def __init__(self, store: Store, cfg: Any, run_dir: Path, sub_roles: list[str], sub_policy: str):
        self.store = store
        self.role = cfg.trainer.role
        self.staleness = Staleness(cfg.trainer.max_staleness)
        self.namespace = cfg.store.namespace
        self.poll_s = cfg.store.poll_s
        self.timeout_s = cfg.store.timeout_s
        self.run_dir = run_dir
        self.sub_roles = sub_roles
        self.sub_policy = sub_policy  # the name of the policy the sub roles act through
        self.loaded = -1  # main: the weights version its sub policy holds

    def start(self, policies: dict[str, Policy]) -> None:
        """A fresh (not resumed) trainer's first contact: main claims the namespace and publishes the sub
        policy it starts with as version 0; sub waits for that version and starts from it."""
        if self.role == "main":
            if self.store.get(WEIGHTS) is not None:
                raise ConfigError(f"store namespace {self.namespace!r} already holds a run; start a new one under "
                                  "another store.namespace=... (both trainers must use it)")
            self.publish(0, policies)
        else:
            self.load(policies, 0, "the main trainer to start and publish the sub-agent's starting weights")

    def publish(self, version: int, policies: dict[str, Policy]) -> None:
        """Save the sub policy as weights ``version`` and announce it (older versions beyond a few are removed)."""
        policy = policies[self.sub_policy]
        root = self.run_dir / "published"
        final = root / f"v{version:06d}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.store.set(WEIGHTS, {"version": version, "path": str(final.resolve())})
        for old in sorted(root.glob("v*"))[:-KEEP_VERSIONS]:
            shutil.rmtree(old, ignore_errors=True)

    def refresh(self, policies: dict[str, Policy], step: int) -> dict[str, float]:
        """Main, before playing step ``step``: load the sub policy's newest published weights, waiting first until
        they reach the oldest version the step may be played from (``Staleness.version``)."""
        least = self.staleness.version(step)
        self.load(policies, least, f"the sub trainer's weights of step {least} or newer")
        return {"store/sub_weights_version": float(self.loaded), "store/lag_steps": float(step - 1 - self.loaded)}

    def load(self, policies: dict[str, Policy], least: int, what: str) -> None:
        """Load the newest published weights into the sub policy, waiting for ``what`` until their version is at
        least ``least``."""
        record = self.store.get(WEIGHTS) or {"version": self.loaded, "path": ""}
        if record["version"] < least:
            record = self.store.wait(WEIGHTS, lambda r: r["version"] >= least, self.poll_s, self.timeout_s, what)
        if record["version"] > self.loaded:
            policies[self.sub_policy].load_weights(Path(record["path"]))
            self.loaded = record["version"]

    def send(self, step: int, samples: list[Sample]) -> dict[str, float]:
        """Main: write step ``step``'s sub-trajectories and its rollouts in one transaction (once per step).

        ``store/written`` is the number of the step's sub-trajectories in the store (also when an earlier
        run of this trainer wrote them).
        """
        existing = self.store.get(f"step/{step}")
        if existing is not None:
            log.info("step %d is already in the store; not written again", step)
            return {"store/written": float(existing["items"])}
        items: dict[str, list[Sample]] = {}
        for s in samples:
            if s.role in self.sub_roles:
                items.setdefault(f"{step}/{s.task}/{s.branch}/{s.role}/{s.segment}", []).append(s)
        rollouts = sorted({(s.task, s.branch) for s in samples})
        record = {"step": step, "items": len(items), "rollouts": rollouts}
        written = self.store.put_many(f"sub/{step}", {k: to_item(v) for k, v in items.items()},
                                      (f"step/{step}", record))
        self.store.set("main", {"step": step})
        return {"store/written": float(written)}

    def receive(self, step: int) -> tuple[list[Sample], dict[int, list[int]], dict[str, float]]:
        """Sub: step ``step``'s unacknowledged sub-trajectory rows, its rollouts per task, and store metrics."""
        record = self.store.wait(f"step/{step}", lambda r: True, self.poll_s, self.timeout_s,
                                 f"the main trainer's step {step}")
        stream = f"sub/{step}"
        items = self.store.read(stream, CONSUMER)
        if len(items) + self.store.acked(stream, CONSUMER) != record["items"]:
            raise RuntimeError(f"store stream {stream} holds {len(items)} unread + "
                               f"{self.store.acked(stream, CONSUMER)} acknowledged items, the main trainer "
                               f"wrote {record['items']}")
        rollouts: dict[int, list[int]] = {}
        for task, branch in record["rollouts"]:
            rollouts.setdefault(task, []).append(branch)
        rows = [row for _, item in items for row in from_item(item)]
        main_step = (self.store.get("main") or {"step": step})["step"]
        return rows, rollouts, {"store/read": float(len(items)), "store/lag_steps": float(main_step - step)}

    def acknowledge(self, steps: range) -> None:
        """Sub: mark every item of ``steps`` as consumed (called once a checkpoint holds their update)."""
        for step in steps:
            self.store.ack(f"sub/{step}", CONSUMER)
