"""The shared store: the same sequence of writes and reads on SQLite and on a real redis-server."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import StoreConfig
from marl_cli.store import Store, build_store
from marl_cli.store.sqlite import SQLiteStore, StoreGoneError
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]


def _answers(port: int) -> bool:
    """Whether a server on ``port`` replies to PING (``+PONG``, or ``-NOAUTH`` when it wants a password)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(workdir: Path, *extra: str) -> Iterator[int]:
    """A throwaway redis-server on a free port (no persistence); yields the port and kills it afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not installed: apt-get install redis-server")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]
    proc = subprocess.Popen([binary, *args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            assert proc.poll() is None, f"redis-server exited with code {proc.returncode}"
            assert time.monotonic() < deadline, "redis-server did not answer PING within 10 s"
            time.sleep(0.02)
        yield port
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Backend:
    """One store backend under test: its config fields, and a way to open (and later close) stores on it."""

    cfg: dict
    opened: list[Store] = field(default_factory=list)

    def open(self, namespace: str = "t") -> Store:
        store = build_store(OmegaConf.structured(StoreConfig(**self.cfg, namespace=namespace)))
        self.opened.append(store)
        return store


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            cfg = {"name": "sqlite", "path": str(tmp_path / "store.sqlite")}
        else:
            cfg = {"name": "redis", "host": "127.0.0.1", "port": stack.enter_context(redis_server(tmp_path / "redis"))}
        backend = Backend(cfg)
        yield backend
        for store in backend.opened:
            store.close()


def items(*indices: int, tag: str = "v") -> dict[str, dict]:
    return {f"k{i:04d}": {tag: i} for i in indices}


def test_put_many_is_idempotent_and_never_overwrites(backend):
    store, other = backend.open(), backend.open()
    assert store.put_many("traj", items(0, 1, 2)) == 3
    assert store.put_many("traj", items(0, 1, 2)) == 0
    assert other.put_many("traj", items(1, 2, 3, 4, tag="new")) == 2  # overlaps: only k0003, k0004 are new
    assert store.put_many("traj", {}) == 0
    assert store.count("traj") == other.count("traj") == 5
    assert store.count("other-stream") == 0
    assert other.read("traj", "sub") == [
        ("k0000", {"v": 0}),
        ("k0001", {"v": 1}),
        ("k0002", {"v": 2}),
        ("k0003", {"new": 3}),
        ("k0004", {"new": 4}),
    ]


def test_racing_writers_write_each_key_once(backend):
    stores = [backend.open() for _ in range(3)]
    written = [0] * len(stores)

    def write(n: int) -> None:  # every writer offers every key, in batches of 7
        for start in range(0, 140, 7):
            written[n] += stores[n].put_many("traj", items(*range(start, start + 7), tag=f"w{n}"))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = stores[0].read("traj", "sub")
    assert sum(written) == stores[0].count("traj") == 140
    assert sorted(key for key, _ in got) == sorted(items(*range(140)))
    assert all(next(iter(item.values())) == int(key[1:]) for key, item in got)


def test_put_many_sets_the_record_in_the_same_transaction(backend):
    writer, observer = backend.open(), backend.open()
    assert writer.put_many("traj", items(0, 1), record=("progress", {"written": 2})) == 2
    assert writer.get("progress") == {"written": 2}
    assert writer.put_many("traj", items(1), record=("progress", {"written": 2, "again": True})) == 0
    assert observer.get("progress") == {"written": 2, "again": True}  # the record is overwritten regardless

    with pytest.raises(TypeError):  # an item that is not JSON: nothing at all is written
        writer.put_many("traj", {"k0002": {"v": 2}, "bad": {"v": object()}}, record=("progress", {"written": 4}))
    with pytest.raises(TypeError):  # a record that is not JSON: the items are not written either
        writer.put_many("traj", items(2, 3), record=("progress", {"v": object()}))
    assert observer.count("traj") == 2
    assert observer.get("progress") == {"written": 2, "again": True}

    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:  # record first, count second: an atomic write never shows the record ahead of items
        while not stop.is_set():
            record = observer.get("progress")
            seen.append((record["written"], observer.count("traj")))

    thread = threading.Thread(target=watch)
    thread.start()
    for start in range(2, 122, 4):
        writer.put_many("traj", items(*range(start, start + 4)), record=("progress", {"written": start + 4}))
    stop.set()
    thread.join()
    assert seen
    assert all(count >= written for written, count in seen)
    assert observer.get("progress") == {"written": 122}


def test_reads_return_what_the_consumer_has_not_acknowledged(backend):
    store = backend.open()
    store.put_many("traj", items(0, 1, 2, 3, 4))
    assert [key for key, _ in store.read("traj", "sub")] == list(items(0, 1, 2, 3, 4))
    assert store.read("traj", "sub") == store.read("traj", "sub")  # reading does not consume
    assert store.ack("traj", "sub", ["k0000", "k0002"]) == 2
    assert store.ack("traj", "sub", ["k0000", "unknown"]) == 0  # already acknowledged, or not in the stream
    assert store.ack("traj", "sub", []) == 0
    assert store.acked("traj", "sub") == 2
    assert store.read("traj", "sub") == [("k0001", {"v": 1}), ("k0003", {"v": 3}), ("k0004", {"v": 4})]
    # another consumer, and another stream, are independent
    assert [key for key, _ in store.read("traj", "eval")] == list(items(0, 1, 2, 3, 4))
    assert store.acked("traj", "eval") == 0
    assert store.ack("other", "sub", ["k0001"]) == 0
    store.put_many("traj", items(5))
    assert [key for key, _ in store.read("traj", "sub")] == ["k0001", "k0003", "k0004", "k0005"]
    assert store.ack("traj", "sub") == 4  # the whole stream: the rest of it
    assert store.ack("traj", "sub") == 0 and store.acked("traj", "sub") == 6 and store.read("traj", "sub") == []
    assert store.ack("empty", "sub") == 0


def test_a_restarted_reader_gets_every_item_exactly_once(backend):
    writer = backend.open()
    writer.put_many("traj", items(*range(10)))
    processed: list[str] = []

    reader = backend.open()
    pending = reader.read("traj", "sub")
    for key, _ in pending[:4]:  # process and acknowledge four items ...
        processed.append(key)
        reader.ack("traj", "sub", [key])
    reader.close()  # ... then "crash" while holding the fifth, unacknowledged

    writer.put_many("traj", items(*range(10, 15)))
    reader = backend.open()
    assert reader.read("traj", "sub")[0][0] == "k0004"
    for key, _ in reader.read("traj", "sub"):
        processed.append(key)
        reader.ack("traj", "sub", [key])
    reader.close()

    assert processed == list(items(*range(15)))
    reader = backend.open()
    assert reader.read("traj", "sub") == []
    assert reader.acked("traj", "sub") == 15


def test_namespaces_are_isolated(backend):
    run1, run2 = backend.open("run1"), backend.open("run2")
    run1.put_many("traj", items(0, 1), record=("progress", {"run": 1}))
    assert run2.put_many("traj", items(1, 2, tag="run2")) == 2
    run1.ack("traj", "sub", ["k0000"])
    assert run1.count("traj") == run2.count("traj") == 2
    assert run2.read("traj", "sub") == [("k0001", {"run2": 1}), ("k0002", {"run2": 2})]
    assert run2.acked("traj", "sub") == 0
    assert run2.get("progress") is None
    assert run1.get("progress") == {"run": 1}
    # names that contain the separator cannot alias another namespace's stream
    nested, outer = backend.open("a:b"), backend.open("a")
    nested.put_many("c", items(0))
    assert outer.count("b:c") == 0
    assert outer.read("b:c", "sub") == []


def test_wait_returns_once_ready_and_times_out_with_a_message(backend):
    main, sub = backend.open(), backend.open()
    main.set("main", {"step": 1})

    def advance() -> None:
        time.sleep(0.2)
        main.set("main", {"step": 2})

    thread = threading.Thread(target=advance)
    thread.start()
    start = time.monotonic()
    got = sub.wait("main", lambda r: r["step"] >= 2, poll_s=0.02, timeout_s=10, what="the main trainer's step 2")
    thread.join()
    assert got == {"step": 2}
    assert 0.15 < time.monotonic() - start < 5

    for name in ("main", "missing"):  # a record that never becomes ready, and one that never appears
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="the main trainer's step 3") as info:
            sub.wait(name, lambda r: r["step"] >= 3, poll_s=0.02, timeout_s=0.2, what="the main trainer's step 3")
        assert 0.2 <= time.monotonic() - start < 2
        assert "\n" not in str(info.value)



def test_a_long_wait_says_what_it_waits_for_periodically_and_when_it_ends(backend, caplog):
    main, sub = backend.open(), backend.open()
    threading.Timer(0.5, lambda: main.set("step/3", {"items": 0})).start()
    with caplog.at_level(logging.INFO, logger="marl_cli.store"):
        sub.wait("step/3", lambda r: True, poll_s=0.02, timeout_s=10, what="the main trainer's step 3",
                 first_report_s=0.1, report_s=0.15)
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert 2 <= len(waiting) <= 4  # at 0.1 s, then every 0.15 s until 0.5 s
    assert all("the main trainer's step 3 (record 'step/3' in store namespace 't', " in m for m in waiting)
    where = f"SQLite file {backend.cfg['path']}" if backend.cfg["name"] == "sqlite" else "Redis server 127.0.0.1:"
    assert where in waiting[0] and "giving up in" in waiting[0]
    assert caplog.records[-1].getMessage().startswith("got the main trainer's step 3 after")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="marl_cli.store"):  # a short wait is the normal rhythm: no line
        sub.wait("step/3", lambda r: True, poll_s=0.02, timeout_s=10, what="the main trainer's step 3")
    assert not caplog.records

WRITER = """
import json, sys, time
from types import SimpleNamespace
from marl_cli.store import build_store

store = build_store(SimpleNamespace(**json.loads(sys.argv[1])))
total = int(sys.argv[2])
for start in range(0, total, 5):
    end = min(start + 5, total)
    batch = {f"k{i:04d}": {"v": i} for i in range(start, end)}
    store.put_many("traj", batch, record=("writer", {"written": end, "done": end == total}))
    time.sleep(0.01)
store.close()
"""

# Processing an item = appending its key to processed.txt, then acknowledging it. After a crash, the item that
# was processed but not yet acknowledged comes back: it is acknowledged without processing it again (skipped).
READER = """
import json, sys, time
from pathlib import Path
from types import SimpleNamespace
from marl_cli.store import build_store

store = build_store(SimpleNamespace(**json.loads(sys.argv[1])))
out = Path(sys.argv[2])
done = set((out / "processed.txt").read_text().split()) if (out / "processed.txt").exists() else set()
with open(out / "processed.txt", "a") as processed, open(out / "skipped.txt", "a") as skipped:
    while True:
        for key, item in store.read("traj", "sub"):
            assert item == {"v": int(key[1:])}, (key, item)
            if key in done:
                skipped.write(key + "\\n")
                skipped.flush()
            else:
                time.sleep(0.003)
                processed.write(key + "\\n")
                processed.flush()
                done.add(key)
            store.ack("traj", "sub", [key])
        writer = store.get("writer")
        if writer is not None and writer["done"] and store.acked("traj", "sub") == writer["written"]:
            break
        time.sleep(0.01)
store.close()
"""


def test_a_reader_killed_mid_stream_and_restarted_loses_and_repeats_nothing(backend, tmp_path):
    total = 200
    cfg = json.dumps(asdict(StoreConfig(**backend.cfg, namespace="procs")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "reader"
    out.mkdir()
    processed = out / "processed.txt"

    def spawn(code: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", code, cfg, *args], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )

    def finish(proc: subprocess.Popen) -> None:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err

    def lines(path: Path) -> list[str]:
        return path.read_text().split() if path.exists() else []

    writer = spawn(WRITER, str(total))
    reader = spawn(READER, str(out))
    try:
        deadline = time.monotonic() + 30
        while len(lines(processed)) < 40:
            assert reader.poll() is None, reader.communicate()[1]
            assert time.monotonic() < deadline, "the reader processed nothing within 30 s"
            time.sleep(0.005)
        reader.kill()
        reader.communicate()
        assert reader.returncode == -9
        assert len(lines(processed)) < total, "the reader finished before it could be killed mid-stream"
        reader = spawn(READER, str(out))
        finish(writer)
        finish(reader)
    finally:
        for proc in (writer, reader):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    assert sorted(lines(processed)) == sorted(items(*range(total)))  # everything, each once
    assert len(lines(out / "skipped.txt")) <= 1  # only the item in flight at the kill came back
    store = backend.open("procs")
    assert store.count("traj") == store.acked("traj", "sub") == total
    assert store.read("traj", "sub") == []


def test_build_store_rejects_unknown_names_and_unusable_places(tmp_path):
    with pytest.raises(ConfigError, match="choose one of: sqlite, redis") as info:
        build_store(OmegaConf.structured(StoreConfig(name="postgres")))
    assert "\n" not in str(info.value)

    port = free_port()  # nothing listens there
    with pytest.raises(ConfigError, match=f"127.0.0.1:{port}") as info:
        build_store(OmegaConf.structured(StoreConfig(name="redis", host="127.0.0.1", port=port)))
    assert "\n" not in str(info.value)

    with pytest.raises(ConfigError, match="store.path") as info:
        build_store(OmegaConf.structured(StoreConfig(name="sqlite", path=str(tmp_path))))  # a directory
    assert "\n" not in str(info.value)

    store = build_store(OmegaConf.structured(StoreConfig(name="sqlite", path=str(tmp_path / "a" / "b" / "s.db"))))
    assert store.namespace == "sqlite"  # the default namespace is the backend's name
    store.close()
    assert (tmp_path / "a" / "b" / "s.db").is_file()


def test_build_store_without_the_redis_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # makes ``import redis`` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install 'marl\[redis\]'"):
        build_store(OmegaConf.structured(StoreConfig(name="redis")))


def test_redis_with_a_password(tmp_path):
    with redis_server(tmp_path, "--requirepass", "secret") as port:
        cfg = {"name": "redis", "host": "127.0.0.1", "port": port, "namespace": "t"}
        store = build_store(OmegaConf.structured(StoreConfig(**cfg, password="secret", db=3)))
        assert store.put_many("traj", items(0)) == 1
        assert store.read("traj", "sub") == [("k0000", {"v": 0})]
        store.close()
        store = build_store(OmegaConf.structured(StoreConfig(**cfg, password="secret", db=0)))
        assert store.count("traj") == 0  # another logical database
        store.close()
        for password in ("", "wrong"):
            with pytest.raises(ConfigError, match="store.password") as info:
                build_store(OmegaConf.structured(StoreConfig(**cfg, password=password)))
            assert "\n" not in str(info.value)


def test_a_store_opened_while_another_process_writes_waits_for_it(tmp_path):
    """Switching a file to WAL needs an exclusive lock, which SQLite refuses at once (no busy wait) while another
    connection writes: the decoupled trainers open a new store together, so opening waits for the writer."""
    path = tmp_path / "store.sqlite"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    done = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    done.start()
    start = time.monotonic()
    store = SQLiteStore(path, "run")
    done.join()
    assert time.monotonic() - start >= 0.25  # it waited for the writer instead of failing
    store.close()
    writer.close()


def test_a_deleted_or_replaced_sqlite_file_stops_the_store(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path, "run")
    store.put_many("s", {"a": {"v": 1}})
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(StoreGoneError, match="was deleted or replaced while this run used it"):
        store.put_many("s", {"b": {"v": 2}})
    with pytest.raises(StoreGoneError):
        store.count("s")
    other = SQLiteStore(path, "run")  # a new file at the same path is not the one the first store wrote to
    assert other.count("s") == 0
    with pytest.raises(StoreGoneError):
        store.read("s", "reader")
