"""The rows ``marl gpu-check`` prints: one per check (pass / fail / skip with a one-line reason, its figures and
seconds), as a text table, as JSON and as Markdown headed with the date and the card (for the docs)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HEADER = ("check", "result", "figures", "seconds")


@dataclass
class Row:
    """One check's outcome: ``status`` (pass, fail or skip), ``reason`` (one line; for fail and skip), the figures it
    measured (name → number or text) and how long it took."""

    check: str
    status: str
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reason: str = ""

    @property
    def result(self) -> str:
        return f"{self.status}: {self.reason}" if self.reason else self.status


def one_line(text: str, width: int = 200) -> str:
    """``text``'s first non-empty line, at most ``width`` characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= width else line[:width - 1] + "…"


def figure(value: Any) -> str:
    """A figure as the table shows it: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def figures_text(figures: dict[str, Any]) -> str:
    return "; ".join(f"{key} {figure(value)}" for key, value in figures.items())


def cells(row: Row) -> tuple[str, str, str, str]:
    return row.check, row.result, figures_text(row.figures), f"{row.seconds:.1f}"


def text_table(rows: list[Row]) -> str:
    """The rows as a plain-text table, columns padded to their widest cell."""
    lines = [HEADER, *(cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
           for line in lines]
    out.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(out)


def markdown(rows: list[Row], title: str) -> str:
    """``title`` (the date and the card) and the rows as a Markdown table (pipes in a cell escaped)."""

    def line(parts: tuple[str, ...]) -> str:
        return "| " + " | ".join(part.replace("|", "\\|") for part in parts) + " |"

    body = [line(HEADER), "|" + "---|" * len(HEADER), *(line(cells(row)) for row in rows)]
    return f"{title}\n\n" + "\n".join(body) + "\n"


def payload(rows: list[Row], machine: dict[str, Any]) -> dict[str, Any]:
    """What the JSON file holds: the machine (date, card, versions) and every row."""
    return {"machine": machine, "rows": [asdict(row) for row in rows]}


def title(machine: dict[str, Any]) -> str:
    """The Markdown heading: ``make gpu-check`` on <date>, <card>, with the versions that ran it."""
    details = ", ".join(f"{key} {value}" for key, value in machine.items()
                        if key not in ("date", "card") and value is not None)
    return f"`make gpu-check` on {machine.get('date', '?')}, {machine.get('card', '?')} ({details})"


def write(rows: list[Row], machine: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """The rows as JSON at ``out`` and as Markdown beside it (``.md``); both paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload(rows, machine), indent=2, default=str) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown(rows, title(machine)))
    return out, md
