"""The store contract shared by decoupled M-GRPO trainers.

A *store* holds, under one ``namespace``:

- **streams**: append-only, ordered collections of JSON-able items, each under a unique key. Writers add
  items idempotently (a key is written once, never overwritten); each *consumer* reads the items it has not
  acknowledged yet and acknowledges them once processed, so a reader that crashes gets them again.
- **records**: small named JSON-able values that are overwritten (progress markers, step numbers), which a
  trainer can ``wait`` on until the other trainer has reached a point.

Backends (SQLite file, Redis server) implement the abstract methods; ``wait`` lives here.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)
FIRST_REPORT_S = 5.0
"""A wait longer than this is logged (shorter ones are the normal rhythm of two trainers in step)..."""
REPORT_S = 30.0
"""... and again every this many seconds until it ends."""


class Store(ABC):
    """Streams of keyed items plus named records, all kept under ``namespace`` so two runs never mix."""

    namespace: str
    location: str  # where the store is, in words (the SQLite file, the Redis server)

    @abstractmethod
    def put_many(self, stream: str, items: dict[str, dict], record: tuple[str, dict] | None = None) -> int:
        """Write ``items`` (key → JSON-able dict) to ``stream`` in one atomic transaction.

        Keys the stream already holds are skipped: re-writing a key never duplicates it and never overwrites
        its first value. When ``record`` = (name, value) is given, that record is set (overwritten) in the
        same transaction, so a reader never sees the record without the items. Returns how many items were
        newly written.
        """

    @abstractmethod
    def read(self, stream: str, consumer: str) -> list[tuple[str, dict]]:
        """Every (key, item) of ``stream`` not yet acknowledged by ``consumer``, in first-write order.

        Reading does not consume: an item is returned again until ``consumer`` acknowledges it.
        """

    @abstractmethod
    def ack(self, stream: str, consumer: str, keys: Iterable[str] | None = None) -> int:
        """Mark ``keys`` of ``stream`` (None: every item it holds) as consumed by ``consumer``; returns how many
        were newly acknowledged.

        Idempotent; keys the stream does not hold are ignored. Acknowledging a whole stream moves no item values.
        """

    @abstractmethod
    def acked(self, stream: str, consumer: str) -> int:
        """How many items of ``stream`` ``consumer`` has acknowledged."""

    @abstractmethod
    def count(self, stream: str) -> int:
        """How many items ``stream`` holds."""

    @abstractmethod
    def set(self, name: str, value: dict) -> None:
        """Set the record ``name`` to ``value`` (overwrites)."""

    @abstractmethod
    def get(self, name: str) -> dict | None:
        """The record ``name``, or None when it was never set."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection; the data stays in the store."""

    def wait(self, name: str, ready: Callable[[dict], bool], poll_s: float, timeout_s: float, what: str,
             first_report_s: float = FIRST_REPORT_S, report_s: float = REPORT_S) -> dict:
        """Poll record ``name`` until it exists and ``ready(value)`` is true; return that value.

        A wait longer than ``first_report_s`` is logged (what is awaited, the record, the store), again every
        ``report_s`` and when it ends, so a trainer waiting for the other never sits silent.

        Args:
            name: the record to watch.
            ready: predicate on the record's value (e.g. ``lambda r: r["step"] >= step``).
            poll_s: seconds between two looks.
            timeout_s: seconds after which to give up (the record is looked at least once).
            what: what is awaited, in words, for the messages (e.g. "the main trainer's step 3").

        Raises:
            TimeoutError: with a one-line message naming ``what``, when ``timeout_s`` passes first.
        """
        start = time.monotonic()
        deadline, report = start + timeout_s, start + first_report_s
        where = f"record {name!r} in store namespace {self.namespace!r}, {self.location}"
        while True:
            value = self.get(name)
            now = time.monotonic()
            if value is not None and ready(value):
                if now - start >= first_report_s:
                    log.info("got %s after %.0f s", what, now - start)
                return value
            if now >= deadline:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what} ({where})")
            if now >= report:
                log.info("waiting for %s (%s): %.0f s so far, giving up in %.0f s (store.timeout_s)", what, where,
                         now - start, deadline - now)
                report = now + report_s
            time.sleep(min(poll_s, deadline - now))
