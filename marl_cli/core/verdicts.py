"""A judge's prompt and its verdict: the rubric template a judge reads, and the score parsed from what it writes.
Shared by the reward models (``rewards/``) and the workflows whose roles judge (MAE's judge, CoMAS's scorers).

The config names the line the judge ends its reply with, ``reward.verdict`` (default ``"Score: {score}"``); its one
``{score}`` slot is where the number goes. From it come both the instruction the rubric shows the judge
(``{verdict}`` in the template, the slot written as ``<low-high>``) and the pattern the reply is parsed with: the
verdict's text around the slot, literally, with a number in the slot; the reply's *last* such line counts. The
number must lie in ``[low, high]``; the reward model's score is it mapped onto [0, 1]::

    score = (s − low) / (high − low)

A reply without the line is a parse failure and one with a number outside the range is out of range: each is
counted and gets the configured ``reward.invalid`` (``rewards/base.py``), never a crash.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any

from marl_cli.config.errors import ConfigError

SLOT = "score"
FIELDS = ("prompt", "completion", "answer", "role", "verdict", "low", "high")
"""What a rubric template may show: the prompt the judged role saw, its whole reply, the answer parsed from it
(``none`` when it gave none), its role, the verdict line to end with, and the score's range."""
SHOWN = ("prompt", "completion", "answer")
"""Fields of which a rubric must show at least one: without them the judge has nothing to judge."""
PAIR_FIELDS = ("prompt", "completion_a", "completion_b", "answer_a", "answer_b", "role", "verdict", "low", "high")
"""What a pairwise rubric may show: the prompt, both replies (the first, the second) and their answers."""
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+))"


def slots(template: str) -> list[str]:
    """The named fields of a ``str.format`` template, in order; a malformed template is a one-line error."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"the template {template!r} does not parse: {exc}") from exc


def check_verdict(verdict: str, key: str = "reward.verdict") -> None:
    """The verdict line has exactly one ``{score}`` slot and no other field."""
    names = slots(verdict)
    if names.count(SLOT) != 1 or len(names) != 1:
        raise ConfigError(f"{key}={verdict!r} needs exactly one {{score}} slot (where the judge writes its number) "
                          f"and no other field, e.g. 'Score: {{score}}'")


def check_asks_verdict(template: str, key: str, who: str = "judge") -> None:
    """``template`` shows its reader the verdict line (the ``{verdict}`` field)."""
    if "verdict" not in slots(template):
        raise ConfigError(f"{key} never tells the {who} how to write its score: add the {{verdict}} field")


def check_template(template: str, key: str, pairwise: bool = False) -> None:
    """A rubric template uses only ``FIELDS`` (``PAIR_FIELDS``) and shows the judge something to judge (one of
    ``SHOWN``; pairwise: both replies)."""
    names, allowed = slots(template), PAIR_FIELDS if pairwise else FIELDS
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ConfigError(f"{key} has unknown fields {unknown}; fields: {', '.join(allowed)}")
    if pairwise:
        for side in ("a", "b"):
            if not {f"answer_{side}", f"completion_{side}"} & set(names):
                raise ConfigError(f"{key} never shows the judge reply {side}: it needs {{answer_{side}}} or "
                                  f"{{completion_{side}}}")
    elif not set(names) & set(SHOWN):
        raise ConfigError(f"{key} shows the judge nothing to judge: it needs {{completion}}, {{answer}} or {{prompt}}")
    check_asks_verdict(template, key)


@dataclass(frozen=True)
class Scale:
    """The judge's score range and its verdict line: renders the instruction and parses a reply."""

    verdict: str = "Score: {score}"
    low: float = 0.0
    high: float = 10.0

    def __post_init__(self) -> None:
        check_verdict(self.verdict)
        if not self.high > self.low:
            raise ConfigError(f"reward.high={self.high} must be above reward.low={self.low}")

    @property
    def instruction(self) -> str:
        """The verdict line as the judge is told to write it: ``Score: <0-10>``."""
        return self.verdict.replace("{score}", f"<{_plain(self.low)}-{_plain(self.high)}>")

    @property
    def pattern(self) -> re.Pattern[str]:
        before, after = self.verdict.split("{score}")
        return re.compile(re.escape(before.strip()) + r"\s*" + _NUMBER + r"\s*" + re.escape(after.strip()))

    def line(self, value: float) -> str:
        """The verdict line with ``value`` in its slot, as a judge writes it (a demonstration's)."""
        return self.verdict.replace("{score}", _plain(value))

    def parse(self, reply: str) -> tuple[float | None, str]:
        """The reply's score in [0, 1] and ``""``; or None and why not: ``"parse"`` (no verdict line) or
        ``"range"`` (its number outside [low, high])."""
        found = self.pattern.findall(reply)
        if not found:
            return None, "parse"
        value = float(found[-1])
        if not self.low <= value <= self.high:
            return None, "range"
        return (value - self.low) / (self.high - self.low), ""


def render(template: str, scale: Scale, **fields: Any) -> str:
    """``template`` filled with ``fields`` and the scale's ``verdict``, ``low`` and ``high``."""
    return template.format(verdict=scale.instruction, low=_plain(scale.low), high=_plain(scale.high), **fields)


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
