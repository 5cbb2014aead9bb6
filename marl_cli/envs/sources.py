"""Question/answer sources shared by the dataset-backed envs (math, research): read, pick columns, filter rows.

A source is a hub dataset id or a local ``.json/.jsonl/.parquet/.csv`` file. Columns are chosen by
name (a dotted path reaches into nested cells: ``prompt.0.content``) or from a list of usual names;
rows without a question or an answer are skipped and counted in one warning, exact duplicates are
dropped, and a source left with no usable row is a one-line ``ConfigError``.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from marl_cli.config.errors import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
LOCAL_COLUMNS_MAX_BYTES = 16 << 20
"""Local files up to this size have their columns read without ``datasets`` (``local_columns``)."""


def is_embedded(cfg: Any) -> bool:
    """Whether a split's source config names the env's own generated tasks."""
    return str(cfg.source).strip() in ("", "embedded")


def load_splits(cfg: Any, load: Callable[[Any, str], list[T]]) -> dict[str, list[T] | None]:
    """Each split's rows (``load(source_cfg, "env.<split>")``; None for an embedded split), loading a source
    named by both splits once, with a warning when evaluation reuses the training rows or repeats rows."""
    rows: dict[str, list[T] | None] = {}
    for split in ("train", "eval"):
        source = getattr(cfg, split)
        shared = split == "eval" and source == cfg.train
        rows[split] = None if is_embedded(source) else rows["train"] if shared else load(source, f"env.{split}")
    train, evals = rows["train"], rows["eval"]
    if evals is not None and evals is train:
        log.warning("env.eval reads the same source as env.train (%s): evaluation tasks are training tasks",
                    cfg.train.source)
    if evals is not None and cfg.eval_size > len(evals):
        log.warning("env.eval_size=%d exceeds the %d rows of env.eval.source=%s: rows repeat; set env.eval_size=%d",
                    cfg.eval_size, len(evals), cfg.eval.source, len(evals))
    return rows


def field_value(row: dict[str, Any], path: str) -> Any:
    """``row`` at the dotted ``path`` (``prompt.0.content``); None where the path does not exist."""
    value: Any = row
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def cell_text(value: Any) -> str:
    """A question or answer cell as text: lists joined with ", ", numbers printed, None empty."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(t for t in (cell_text(v) for v in value) if t)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def read_source(source: str, subset: str, split: str, where: str, key: str = "source") -> Any:
    """The ``datasets.Dataset`` of a local file or a hub dataset; a one-line ConfigError naming ``<where>.<key>``
    when it cannot load. A missing local file fails before ``datasets`` is imported (a second of imports); a source
    read once is not read again in this process (the config check and the env read the same data)."""
    local = Path(source).expanduser()
    builder = FILE_BUILDERS.get(local.suffix.lower())
    if builder and not local.is_file():
        raise ConfigError(f"{where}.{key}={source!r}: no such file")
    try:
        if builder:
            stat = local.stat()
            return loaded(builder, str(local.resolve()), "", "train", stat.st_mtime_ns, stat.st_size)
        return loaded("", source, subset, split)
    except Exception as exc:  # network, gated or missing dataset, bad split or config, unreadable file
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConfigError(f"{where}.{key}={source!r} could not be loaded (split {split!r}: {detail})") from exc


def local_columns(source: str) -> list[str] | None:
    """The columns of a small local JSON Lines, JSON (a list of rows) or CSV file, read without ``datasets`` (a second
    of imports): every JSON row's keys, the CSV header; None for anything else — a file over
    ``LOCAL_COLUMNS_MAX_BYTES`` (``datasets`` reads it faster, once, for the env too), a CSV header pandas would rename
    (repeated or empty names), a file that does not parse so (``read_source`` then says what is wrong)."""
    local = Path(source).expanduser()
    suffix = local.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv") or not local.is_file():
        return None
    if local.stat().st_size > LOCAL_COLUMNS_MAX_BYTES:
        return None
    try:
        with local.open(newline="" if suffix == ".csv" else None, encoding="utf-8") as f:
            if suffix == ".csv":
                header = next(csv.reader(f), None)
                return header if header and all(header) and len(set(header)) == len(header) else None
            rows = [json.loads(line) for line in f if line.strip()] if suffix == ".jsonl" else json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        return None
    return list(dict.fromkeys(key for row in rows for key in row))


@lru_cache(maxsize=16)
def loaded(builder: str, source: str, subset: str, split: str, mtime_ns: int = 0, size: int = 0) -> Any:
    """``datasets.load_dataset`` of a local file by its ``builder`` (keyed by its modification time and size too, so a
    file changed in between is read again) or of a hub dataset."""
    from datasets import load_dataset

    if builder:
        return load_dataset(builder, data_files=source, split=split)
    return load_dataset(source, subset or None, split=split)


def pick_field(given: str, default: str, candidates: tuple[str, ...], columns: list[str], where: str,
               key: str) -> str:
    """The column ``key`` names: the given one, else the preset's, else the first usual name present."""
    field = given or default
    if field:
        if field.split(".")[0] not in columns:
            raise ConfigError(f"{where}.{key}={field!r} is not a column; columns: {', '.join(columns)}")
        return field
    for name in candidates:
        if name in columns:
            return name
    raise ConfigError(f"{where}.{key} is not set and none of {', '.join(candidates)} is a column; "
                      f"columns: {', '.join(columns)}")


def iter_rows(data: Any, batch_size: int = 4096) -> Iterator[dict[str, Any]]:
    """The rows of a ``datasets.Dataset`` as dicts, read in batches (much faster than row by row)."""
    for batch in data.iter(batch_size=batch_size):
        columns = list(batch)
        yield from (dict(zip(columns, values, strict=True)) for values in zip(*batch.values(), strict=True))


def usable_pairs(pairs: Iterable[tuple[str, str]], limit: int, where: str, source: str, fields: tuple[str, str],
                 total: int) -> list[tuple[str, str]]:
    """The first ``limit`` (0: all) distinct (question, answer) pairs with both parts non-empty.

    Skipped rows are counted in one warning naming the first few; ``fields`` (question, answer column)
    and ``total`` (rows read) only shape the messages.
    """
    kept: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    skipped: list[int] = []
    duplicates = 0
    for i, (question, answer) in enumerate(pairs):
        if not question or not answer:
            skipped.append(i)
            continue
        if (question, answer) in seen:
            duplicates += 1
            continue
        seen.add((question, answer))
        kept.append((question, answer))
        if limit and len(kept) >= limit:
            break
    qfield, afield = fields
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        log.warning("%s.source=%s: skipped %d of %d rows with a missing or empty %s or %s (rows %s)",
                    where, source, len(skipped), total, qfield, afield, shown)
    if duplicates:
        log.info("%s.source=%s: dropped %d duplicate rows", where, source, duplicates)
    if not kept:
        raise ConfigError(f"{where}.source={source!r} has no row with both a {qfield} and an {afield}")
    return kept
