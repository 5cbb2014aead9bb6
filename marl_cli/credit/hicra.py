"""HICRA: hierarchy-aware credit assignment (Wang et al., "Emergent Hierarchical Reasoning in LLMs through RL",
arXiv 2509.03646). Same rollouts and groups as the algorithm; per completion token t of a row with advantage A,

    A'(t) = A(t) + α·|A(t)|·m(t)

where m(t) = 1 on tokens of planning spans and 0 elsewhere: credit on planning tokens is amplified when the row
did well (A > 0) and blame on them softened when it did badly (A < 0); execution tokens keep A.

Which tokens plan is a plug-in (``credit.detector``, registered in ``DETECTORS``): ``phrases`` marks every token
that overlaps one of ``credit.phrases`` (case-insensitive "strategic grams": the paper mines them as frequent
n-grams of reasoning traces; the default list is ours, of the kinds it names: planning, verification,
backtracking), ``before_answer`` marks every token before the last ``workflow.answer_marker`` (an agent's reasoning
before it commits to an answer, e.g. the plan agent's before ``####``). ``credit/hicra_marked_fraction`` logs the
share of completion tokens marked, per role too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import CreditConfig, bounded
from marl_cli.core.samples import Sample
from marl_cli.credit.base import CREDITS, Credit

STRATEGIC_GRAMS = ["let's", "let me", "first,", "first i", "we need to", "i need to", "the key", "the goal",
                   "my plan", "plan:", "step by step", "next,", "then,", "so the", "therefore", "because",
                   "wait", "but wait", "hmm", "alternatively", "instead", "on second thought", "let me check",
                   "double-check", "verify", "check", "re-examine", "notice", "that means", "this means"]
"""Phrases of planning, verification and backtracking the ``phrases`` detector marks by default."""

Detector = Callable[[list[str], Any, Any], list[bool]]
"""``(the completion's tokens as text pieces, credit config, run config) -> one mark per token``."""
DETECTORS: dict[str, Detector] = {}


def detector(name: str) -> Callable[[Detector], Detector]:
    """A decorator registering a planning-span detector as ``credit.detector=<name>``."""
    def add(fn: Detector) -> Detector:
        DETECTORS[name] = fn
        return fn
    return add


def spans_to_tokens(pieces: list[str], spans: list[tuple[int, int]]) -> list[bool]:
    """Which tokens (text ``pieces``, concatenated) overlap any character span ``[start, end)``."""
    marks, start = [], 0
    for piece in pieces:
        end = start + len(piece)
        marks.append(any(a < max(end, start + 1) and b > start for a, b in spans))
        start = end
    return marks


@detector("phrases")
def phrase_spans(pieces: list[str], credit: Any, cfg: Any) -> list[bool]:
    """Tokens overlapping an occurrence of one of ``credit.phrases`` (case-insensitive), every occurrence counted,
    overlapping ones too (``step by step by step`` holds ``step by step`` twice): a lookahead match consumes no text."""
    text = "".join(pieces)
    spans = [m.span(1) for phrase in credit.phrases if phrase
             for m in re.finditer(f"(?=({re.escape(phrase)}))", text, re.IGNORECASE)]
    return spans_to_tokens(pieces, spans)


@detector("before_answer")
def before_answer(pieces: list[str], credit: Any, cfg: Any) -> list[bool]:
    """Tokens before the last ``workflow.answer_marker`` (none when the completion has no marker, or the marker is
    empty: the whole reply is the answer)."""
    marker = cfg.workflow.answer_marker
    cut = "".join(pieces).rfind(marker) if marker else -1
    return spans_to_tokens(pieces, [(0, cut)] if cut > 0 else [])


@dataclass
class HicraConfig(CreditConfig):
    """HICRA (``credit=hicra``): amplify the advantage on planning tokens by α·|A|."""

    alpha: float = bounded(0.2, ge=0.0)  # α in A' = A + α·|A|·m(t); the paper uses 0.2
    detector: str = "phrases"  # which tokens plan: phrases (credit.phrases) | before_answer (before the marker)
    phrases: list[str] = field(default_factory=lambda: list(STRATEGIC_GRAMS))  # strategic grams (case-insensitive)


def check_hicra(cfg: Any) -> None:
    if cfg.credit.detector not in DETECTORS:
        raise ConfigError(f"credit.detector={cfg.credit.detector!r} is not registered; choose from: "
                          f"{', '.join(sorted(DETECTORS))}")
    if cfg.credit.detector == "phrases" and not any(cfg.credit.phrases):
        raise ConfigError("credit.detector=phrases with no credit.phrases marks nothing: name some phrases")


def hicra(values: list[float], marks: list[bool], alpha: float) -> list[float]:
    """A'(t) = A(t) + α·|A(t)|·m(t) for one row."""
    return [a + alpha * abs(a) * m for a, m in zip(values, marks, strict=True)]


def hicra_advantages(rows: list[Sample], credit: Any, run: Any) -> dict[str, float]:
    """Each row's token advantages under HICRA; the share of tokens marked (all, and per role)."""
    find = DETECTORS[credit.detector]
    marked: dict[str, list[int]] = {}
    for s in rows:
        if s.policy not in run.policies:  # a scripted role's rows: nothing learns from them
            continue
        tokenizer = run.policies[s.policy].tokenizer
        pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in s.completion_ids]
        marks = find(pieces, credit, run.cfg)
        s.token_advantages = hicra(s.per_token(), marks, credit.alpha)
        counts = marked.setdefault(s.role, [0, 0])
        counts[0] += sum(marks)
        counts[1] += len(marks)
    stats = {f"hicra_marked_fraction/{role}": m / max(n, 1) for role, (m, n) in marked.items()}
    stats["hicra_marked_fraction"] = sum(m for m, _ in marked.values()) / max(sum(n for _, n in marked.values()), 1)
    return stats


CREDITS.register("hicra", schema=HicraConfig, check=check_hicra)(Credit(advantages=hicra_advantages))
