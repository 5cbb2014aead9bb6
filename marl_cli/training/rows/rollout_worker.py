"""Asynchronous rollouts (``trainer.max_staleness=k`` > 0): a rollout worker process plays the next steps'
episodes while the learner trains; this module holds both its sides.

**Schedule.** Step s is played from the weights after update v(s) = max(0, s − 1 − k) (its *policy version*, on
every row: ``Sample.policy_version``; the rule is ``core/staleness.py``'s) and trained after update s − 1, so
every row is min(k, s − 1) updates old (its *staleness*) and never more: the worker waits for the version a step
needs instead of running further ahead. No row is ever dropped for its age, so no generation is wasted
(discard-and-requeue starves slow, long episodes); how the learner treats the bounded staleness is
``trainer.is_correction`` (``*_truncate``: importance-correct each token or row by exp(learner − sampler
log-prob); ``*_mask``: drop the tokens or rows whose ratio leaves the bounds; ``none``: train them as on-policy).
A tree rollout is played inside one step, so it stays within one version.

**Determinism.** Step s's episodes are drawn from a seed of (run seed, step, rank) and version v(s), never from
the timing, so a run with k > 0 is as reproducible as a synchronous one (on the same machine and threads).

**Weights.** After each update the learner sends the policies whose weights changed (a full model's state dict, an
adapter's weights only) as one serialized copy through a pipe: the learner's cost is that copy. The worker loads
the versions in order. **Memory:** the worker holds one more copy of every policy and its rollout backend; the pipe
holds at most k + 1 versions and the rows queue at most k steps (a step's rows are token ids and log-probs, small
beside a model).

**No lost work.** A checkpoint of step c holds the rows already played for steps c + 1 … c + k (the learner waits
for them: every version they need exists), so a resume continues from exactly where the run was: in-flight rows are
checkpointed, not regenerated. The worker ignores SIGINT/SIGTERM (the learner stops it once its checkpoint is
written). A worker that dies, or stays silent longer than ``trainer.heartbeat_timeout_s`` (it reports at every
generate call and while it waits), stops the run with one line (``RunError``); the newest checkpoint stands.

One worker per training process: under a launcher rank r's worker plays rank r's share of each step's tasks.
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
import os
import queue
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marl_cli.config.errors import RunError

log = logging.getLogger(__name__)
POLL_S = 0.5
"""How often a waiting side looks at the other (and the worker reports that it is alive)."""


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of step ``step``'s episodes on rank ``rank``: a function of the three only."""
    return random.Random(f"marl-rollout/{seed}/{step}/{rank}").getrandbits(62)


@dataclass
class Played:
    """One step's episodes as a rollout worker played them (this process's share)."""

    step: int
    version: int
    result: Any  # RolloutResult
    seconds: float


@dataclass
class WorkerSpec:
    """What a rollout worker starts from (picklable without torch; the policies follow as the first message on
    the weights queue, whose feeder thread writes them: a worker that dies while it starts cannot block the
    learner)."""

    cfg: dict[str, Any]
    role_map: dict[str, str]
    routing: dict[str, str]
    staleness: Any  # core.staleness.Staleness
    version: int
    first_step: int
    rank: int
    size: int
    parent: int


def serialize(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def deserialize(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


class RolloutWorker:
    """The learner's handle on its rollout worker process: start it, send it each update's weights, take each
    step's rows, stop it. Every wait checks that the worker is alive and not stuck.

    Args:
        run: the run (its config, policies, routing, world).
        version: the updates the policies hold now.
        first_step: the first step the worker plays (the steps before it are played already).
    """

    def __init__(self, run: Any, version: int, first_step: int):
        cfg = run.cfg
        self.run_dir = run.run_dir
        self.heartbeat_s = cfg.trainer.heartbeat_timeout_s
        self.sent = {name: policy.version for name, policy in run.policies.items()}
        ctx = multiprocessing.get_context("spawn")
        self.weights: Any = ctx.Queue()
        self.rows: Any = ctx.Queue(maxsize=max(run.staleness.max_staleness, 1))
        self.beat: Any = ctx.Value("d", time.time())
        from omegaconf import OmegaConf

        spec = WorkerSpec(OmegaConf.to_container(cfg, resolve=True), dict(run.role_map), dict(run.routing),
                          run.staleness, version, first_step, run.world.rank, run.world.size, os.getpid())
        self.weights.put((version, serialize(run.policies)))
        self.process = ctx.Process(target=worker_main, args=(spec, self.weights, self.rows, self.beat),
                                   name=f"marl-rollout-{run.world.rank}", daemon=True)
        with spawn_start_method():
            self.process.start()
        log.info("rollout worker %d started (trainer.max_staleness=%d): it plays step %d on from weights version "
                 "%d", self.process.pid, cfg.trainer.max_staleness, first_step, version)

    def send(self, version: int, policies: dict[str, Any]) -> None:
        """Weights ``version`` (after that many updates): the policies that changed since the last send."""
        changed = {name: policy.trained_state() for name, policy in policies.items()
                   if policy.version != self.sent.get(name)}
        self.sent = {name: policy.version for name, policy in policies.items()}
        self.weights.put((version, serialize(changed) if changed else b""))

    def receive(self, step: int) -> Played:
        """Step ``step``'s rows, waiting for them as long as the worker is alive and reports."""
        while True:
            try:
                message = self.rows.get(timeout=POLL_S)
            except queue.Empty:
                self.check(step)
                continue
            if message[0] == "error":
                raise RunError(f"the rollout worker failed while playing step {step}: {message[1]}; "
                               f"{self.resume_hint()}")
            played = message[1]
            if played.step != step:
                raise RunError(f"the rollout worker sent step {played.step} where step {step} was due")
            return played

    def check(self, step: int) -> None:
        """Raise ``RunError`` if the worker died or has been silent longer than the heartbeat timeout."""
        if not self.process.is_alive():
            raise RunError(f"the rollout worker (pid {self.process.pid}) exited with code {self.process.exitcode} "
                           f"while playing step {step}; {self.resume_hint()}")
        silent = time.time() - self.beat.value
        if silent > self.heartbeat_s:
            self.process.kill()
            raise RunError(f"the rollout worker (pid {self.process.pid}) has not reported for {silent:.0f} s "
                           f"(trainer.heartbeat_timeout_s={self.heartbeat_s:g}) while playing step {step}: it is "
                           f"stuck and was stopped; {self.resume_hint()}")

    def resume_hint(self) -> str:
        """How to go on: from the newest checkpoint, or (none written yet) from the start."""
        if any((self.run_dir / "checkpoints").glob("step_*")):
            return f"the newest checkpoint stands: go on with trainer.resume={self.run_dir}"
        return "no checkpoint was written yet: start the run again"

    def stop(self) -> None:
        """Stop the worker (it holds nothing a checkpoint lacks)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        for channel in (self.weights, self.rows):
            channel.cancel_join_thread()
            channel.close()


def worker_main(spec: WorkerSpec, weights: Any, rows: Any, beat: Any) -> None:
    """The rollout worker process: play steps ``first_step``, … in order, each from the weights version the
    schedule gives it, and put each step's rows on ``rows``; an error goes there as one line."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the learner decides when the worker stops
        signal.signal(sig, signal.SIG_IGN)
    loading = threading.Event()
    threading.Thread(target=_beat_while, args=(loading, beat), daemon=True).start()
    try:
        loading.set()
        worker = _Worker(spec, weights, rows, beat, loading)
        loading.clear()
        worker.loop()
    except BaseException as exc:  # the learner reports it (and stops the run)
        loading.set()  # alive while the error waits for room in the queue
        hand_over(rows, beat, spec.parent, ("error", f"{type(exc).__name__}: {exc}"))
        rows.close()
        rows.join_thread()


def _beat_while(loading: threading.Event, beat: Any) -> None:
    """Report alive while the worker loads (imports, models, weights): no generate call marks its progress then."""
    while True:
        loading.wait()
        beat.value = time.time()
        time.sleep(POLL_S)


class _Worker:
    """The worker process's state: its own rollout of the run (team, policies, backend) and where it is."""

    def __init__(self, spec: WorkerSpec, weights: Any, rows: Any, beat: Any, busy: threading.Event):
        import torch
        from omegaconf import OmegaConf

        from marl_cli import determinism
        from marl_cli.config.team import Schedule
        from marl_cli.training.build import build_rollout, build_team

        self.spec, self.weights, self.rows, self.beat, self.busy = spec, weights, rows, beat, busy
        self.cfg = cfg = OmegaConf.create(spec.cfg)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.trainer.deterministic:
            determinism.apply(cfg.threads)
        self.version = spec.version
        _, policies = self.next_weights()
        self.rollout = build_rollout(cfg, build_team(cfg), deserialize(policies), dict(spec.routing))
        self.rollout.generator = _Beating(self.rollout.generator, beat)
        self.schedule = Schedule.of(cfg, spec.role_map)

    def loop(self) -> None:
        for step in range(self.spec.first_step, self.cfg.trainer.steps + 1):
            while self.version < self.spec.staleness.version(step):
                with self.loading():
                    self.load_next()
            self.put(("rows", self.play(step)))

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Report alive while the worker loads something no generate call marks (weights, a backend's engines)."""
        self.busy.set()
        try:
            yield
        finally:
            self.busy.clear()

    def load_next(self) -> None:
        """Wait for the learner's next weights version and load it."""
        version, data = self.next_weights()
        for name, state in (deserialize(data) if data else {}).items():
            self.rollout.policies[name].load_trained_state(state)
        self.version = version

    def next_weights(self) -> tuple[int, bytes]:
        """The next message on the weights queue: (version, serialized weights), waiting for it."""
        waited, limit = 0.0, self.cfg.trainer.weight_sync_timeout_s
        while True:
            try:
                return self.weights.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
                self.alive_or_exit()
                if waited > limit:
                    raise TimeoutError(f"waited {waited:.0f} s for the learner's weights after version "
                                       f"{self.version} (trainer.weight_sync_timeout_s={limit:g})") from None

    def play(self, step: int) -> Played:
        """This rank's share of step ``step``'s tasks, from its own seed."""
        import torch

        from marl_cli.core.world import World
        from marl_cli.training.rows.distributed import renumbered

        t0 = time.perf_counter()
        cfg, rollout, spec = self.cfg, self.rollout, self.spec
        if self.schedule.swap_every:
            rollout.routing = {**rollout.routing, **self.schedule.routing(spec.role_map, step)}
        seed = step_seed(cfg.seed, step, spec.rank)
        torch.manual_seed(seed)
        world = World(spec.rank, spec.size)
        with self.loading():
            rollout.start_generator()  # vLLM: the engines start (or wake) here
        result = rollout.play(world.share(step_tasks(rollout.workflow, step, cfg.rollout.tasks_per_step)),
                              cfg.algorithm.num_generations, random.Random(seed))
        spec.staleness.stamp(result.samples, self.version)
        return Played(step, self.version, renumbered(world, result), time.perf_counter() - t0)

    def put(self, message: tuple[str, Any]) -> None:
        hand_over(self.rows, self.beat, self.spec.parent, message)

    def alive_or_exit(self) -> None:
        alive_or_exit(self.beat, self.spec.parent)


def hand_over(rows: Any, beat: Any, parent: int, message: tuple[str, Any]) -> None:
    """Hand a step's rows (or an error) to the learner, waiting while the queue is full (``max_staleness`` steps)
    and the learner is there."""
    while True:
        beat.value = time.time()
        try:
            rows.put(message, timeout=POLL_S)
            return
        except queue.Full:
            alive_or_exit(beat, parent)


def alive_or_exit(beat: Any, parent: int) -> None:
    """Report alive; leave if the learner is gone (process ``parent`` no longer this one's parent)."""
    beat.value = time.time()
    if os.getppid() != parent:
        os._exit(0)


@contextlib.contextmanager
def spawn_start_method() -> Iterator[None]:
    """Start the worker under a start method a fresh interpreter knows: a job of Hydra's joblib launcher runs in a
    loky process, whose default start method (``loky``) the spawned worker would fail to set up."""
    method = multiprocessing.get_start_method(allow_none=True)
    if method in (None, "fork", "spawn", "forkserver"):
        yield
        return
    multiprocessing.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(method, force=True)


class _Beating:
    """A rollout backend that reports the worker alive at every generate call."""

    def __init__(self, generator: Any, beat: Any):
        self._generator, self._beat = generator, beat

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._beat.value = time.time()
        out = self._generator.generate(*args, **kwargs)
        self._beat.value = time.time()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._generator, name)


def step_tasks(workflow: Any, step: int, per_step: int) -> list[Any]:
    """The training tasks of step ``step``: ``per_step`` of them, following the previous step's."""
    return [workflow.env.task("train", (step - 1) * per_step + j) for j in range(per_step)]
