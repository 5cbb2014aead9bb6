"""The embedded store: one SQLite file that trainer processes on the same machine open concurrently.

WAL mode lets readers work while a writer commits; every write is a ``BEGIN IMMEDIATE`` transaction and
a busy timeout makes concurrent writers queue instead of failing. Items are ordered by an autoincrement
sequence, i.e. by first write. WAL needs shared memory, so the file must not sit on a network filesystem:
trainers on several machines use the Redis store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from marl_cli.config.errors import ConfigError
from marl_cli.store.base import Store

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS items (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        ns TEXT NOT NULL, stream TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        UNIQUE (ns, stream, key))""",
    """CREATE TABLE IF NOT EXISTS acks (
        ns TEXT NOT NULL, stream TEXT NOT NULL, consumer TEXT NOT NULL, key TEXT NOT NULL,
        PRIMARY KEY (ns, stream, consumer, key)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS records (
        ns TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (ns, name)) WITHOUT ROWID""",
)


class StoreGoneError(RuntimeError):
    """The store's database file is no longer the one this process opened."""


class SQLiteStore(Store):
    """A store in the SQLite database file ``path`` (created with its parent directories if missing).

    One connection per store object, shared by its threads under a lock; each process opens its own store.

    Args:
        path: the database file; every process of one run opens the same one.
        namespace: prefix separating this run's streams and records from others in the same file.
        busy_timeout_s: how long a statement waits for another process's write to finish before failing.
    """

    def __init__(self, path: str | Path, namespace: str, busy_timeout_s: float = 30.0) -> None:
        self.namespace = namespace
        self.path = Path(path)
        self.location = f"SQLite file {self.path}"
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: no implicit transactions; every write opens its own BEGIN IMMEDIATE.
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._use_wal(busy_timeout_s)
            self._identity = self._file_identity()
            with self._write() as conn:
                for statement in _SCHEMA:
                    conn.execute(statement)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"store.path={str(path)!r}: cannot open the SQLite store ({exc})") from exc

    def _use_wal(self, timeout_s: float) -> None:
        """Switch the file to WAL (the first open creates it). The switch needs an exclusive lock, and SQLite
        fails it at once, without its busy wait, while another connection writes (two processes opening a new
        store together): retry until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_dev, stat.st_ino

    def _check_file(self) -> None:
        """Stop when the database file was deleted or replaced under the open connection: writes would go to
        a file no other process sees (SQLite keeps writing to the unlinked inode)."""
        if self._file_identity() != self._identity:
            raise StoreGoneError(f"the SQLite store {self.path} was deleted or replaced while this run used it; "
                                 "what was acknowledged before is in the checkpoints, restart both trainers")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, locked from its start so that concurrent writers queue, never deadlock."""
        with self._lock:
            self._check_file()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple) -> list[tuple]:
        with self._lock:
            self._check_file()
            return self._conn.execute(sql, params).fetchall()

    def put_many(self, stream: str, items: dict[str, dict], record: tuple[str, dict] | None = None) -> int:
        rows = [(self.namespace, stream, key, json.dumps(value)) for key, value in items.items()]
        with self._write() as conn:
            written = conn.executemany(
                "INSERT OR IGNORE INTO items (ns, stream, key, value) VALUES (?, ?, ?, ?)", rows
            ).rowcount
            if record is not None:
                self._set(conn, *record)
        return max(written, 0)

    def read(self, stream: str, consumer: str) -> list[tuple[str, dict]]:
        rows = self._query(
            "SELECT key, value FROM items AS i WHERE ns = ? AND stream = ? AND NOT EXISTS ("
            " SELECT 1 FROM acks AS a WHERE a.ns = i.ns AND a.stream = i.stream AND a.consumer = ? AND a.key = i.key"
            ") ORDER BY seq",
            (self.namespace, stream, consumer),
        )
        return [(key, json.loads(value)) for key, value in rows]

    def ack(self, stream: str, consumer: str, keys: Iterable[str] | None = None) -> int:
        insert = ("INSERT OR IGNORE INTO acks (ns, stream, consumer, key)"
                  " SELECT ns, stream, ?, key FROM items WHERE ns = ? AND stream = ?")
        with self._write() as conn:
            if keys is None:
                acked = conn.execute(insert, (consumer, self.namespace, stream)).rowcount
            else:
                rows = [(consumer, self.namespace, stream, key) for key in keys]
                acked = conn.executemany(insert + " AND key = ?", rows).rowcount
        return max(acked, 0)

    def acked(self, stream: str, consumer: str) -> int:
        sql = "SELECT COUNT(*) FROM acks WHERE ns = ? AND stream = ? AND consumer = ?"
        return self._query(sql, (self.namespace, stream, consumer))[0][0]

    def count(self, stream: str) -> int:
        return self._query("SELECT COUNT(*) FROM items WHERE ns = ? AND stream = ?", (self.namespace, stream))[0][0]

    def set(self, name: str, value: dict) -> None:
        with self._write() as conn:
            self._set(conn, name, value)

    def _set(self, conn: sqlite3.Connection, name: str, value: dict) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO records (ns, name, value) VALUES (?, ?, ?)",
            (self.namespace, name, json.dumps(value)),
        )

    def get(self, name: str) -> dict | None:
        rows = self._query("SELECT value FROM records WHERE ns = ? AND name = ?", (self.namespace, name))
        return json.loads(rows[0][0]) if rows else None

    def close(self) -> None:
        with self._lock:
            self._conn.close()
