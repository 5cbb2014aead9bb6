"""Where math tasks come from: the embedded problem generator and the dataset loaders.

The embedded generator writes short arithmetic and algebra problems with exact integer or fraction
answers (``What is 12 * 7 - 5?``, ``Solve 3x + 4 = 19.``, ``Tom has 7 apples and buys 5 more. How
many apples?``), small enough for the tiny character-level model. A problem belongs to the held-out
(eval) side exactly when a hash of its question says so, so train and eval questions never coincide.

Loaded sources are a preset name (``PRESETS``), a hub dataset id, or a local .json/.jsonl/.parquet/.csv
file, all read through ``datasets.load_dataset``. Rows whose question or answer is missing or empty
are skipped and counted (one warning per source); exact duplicate rows are dropped.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from marl_cli.envs.sources import cell_text, field_value, iter_rows, pick_field, read_source, usable_pairs

KINDS = ("arithmetic", "add_sub", "word", "linear")
HOLDOUT_BUCKETS = 8
"""One question in ``HOLDOUT_BUCKETS`` (by hash) is held out for evaluation; the others are for training."""


@dataclass(frozen=True)
class MathTask:
    """A question and its gold answer; ``expr`` is a Python expression over integers equal to the answer
    (embedded problems only: evaluate it with every integer read as a ``Fraction``)."""

    question: str
    answer: str
    expr: str = ""


# ---------------------------------------------------------------------------------------------
# The embedded generator


def fraction_text(value: Fraction) -> str:
    """``Fraction(11, 4)`` → ``11/4``; whole numbers without a denominator."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def exact_value(expr: str) -> Fraction:
    """Evaluate an integer expression exactly (every integer literal read as a ``Fraction``)."""
    if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
        raise ValueError(f"not an integer expression: {expr!r}")
    return eval(re.sub(r"\d+", lambda m: f"Fraction({m.group()})", expr), {"Fraction": Fraction})


def held_out(question: str) -> bool:
    """Whether ``question`` belongs to the evaluation side of the embedded generator."""
    return zlib.crc32(question.encode()) % HOLDOUT_BUCKETS == 0


_NAMES = ("Tom", "Ana", "Sam", "Mia", "Leo", "Ivy", "Max", "Zoe")
_ITEMS = ("apples", "pens", "cards", "books", "coins", "eggs", "balls", "shells")


def _arithmetic(rng: random.Random, m: int) -> tuple[str, str]:
    a, b, c = (rng.randint(1, m) for _ in range(3))
    ops = [rng.choice("+-*") for _ in range(2)]
    if rng.random() < 0.2:
        ops[rng.randrange(2)] = "/"
    expr = f"{a} {ops[0]} {b}" if rng.random() < 0.3 else f"{a} {ops[0]} {b} {ops[1]} {c}"
    return f"What is {expr}?", expr


def _add_sub(rng: random.Random, m: int) -> tuple[str, str]:
    """One addition or subtraction of two operands up to ``m`` (never negative): the easiest kind."""
    a, b = rng.randint(1, m), rng.randint(1, m)
    expr = f"{a} + {b}" if rng.random() < 0.5 else f"{max(a, b)} - {min(a, b)}"
    return f"What is {expr}?", expr


def _word(rng: random.Random, m: int) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(1, m), rng.randint(2, max(2, m))
    kind = rng.randrange(5)
    if kind == 0:
        return f"{name} has {a} {item} and buys {b} more. How many {item}?", f"{a} + {b}"
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", f"{a} - {b}"
    if kind == 2:
        return f"{name} has {a} bags with {b} {item} each. How many {item}?", f"{a} * {b}"
    if kind == 3:
        return (f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each get?",
                f"{a * b} / {b}")
    return f"{name} shares {a} cakes equally among {b} friends. How much cake does each get?", f"{a} / {b}"


def _linear(rng: random.Random, m: int) -> tuple[str, str]:
    a, b = rng.randint(2, max(2, m)), rng.randint(1, m)
    c = a * rng.randint(0, m) + b if rng.random() < 0.75 else rng.randint(b, b + a * m)
    if rng.random() < 0.5:
        return f"Solve {a}x + {b} = {c}.", f"({c} - {b}) / {a}"
    return f"Solve {a}x - {b} = {c}.", f"({c} + {b}) / {a}"


_MAKERS = {"arithmetic": _arithmetic, "add_sub": _add_sub, "word": _word, "linear": _linear}


def _add_sub_shape(ops: list[str], value: Fraction) -> bool:
    return len(ops) == 1 and ops[0] in "+-" and value >= 0


def _arithmetic_shape(ops: list[str], value: Fraction) -> bool:
    return len(ops) in (1, 2) and ops.count("/") <= 1


SHAPES = {"add_sub": _add_sub_shape, "arithmetic": _arithmetic_shape}
"""The kinds whose questions are bare expressions, and the test of an expression's shape against each: operands
from 1 to ``max_operand`` joined left to right without parentheses, as the kind's generator writes them."""


def in_kinds(expr: str, kinds: list[str], max_operand: int) -> bool:
    """Whether ``expr`` (``12 - 4``) has the shape of a question one of ``kinds`` generates (``SHAPES``)."""
    tokens = expr.split()
    numbers, ops = tokens[0::2], tokens[1::2]
    if len(tokens) % 2 == 0 or not all(n.isdigit() and 1 <= int(n) <= max_operand for n in numbers):
        return False
    if not all(op in "+-*/" and len(op) == 1 for op in ops):
        return False
    value = exact_value(expr)
    return any(SHAPES[kind](ops, value) for kind in kinds if kind in SHAPES)


def generate(seed: int, max_operand: int, kinds: list[str], holdout: bool) -> MathTask:
    """The problem of ``seed``: drawn until its question lies on the requested (train/eval) side."""
    rng = random.Random(seed)
    while True:
        question, expr = _MAKERS[rng.choice(kinds)](rng, max_operand)
        if held_out(question) == holdout:
            return MathTask(question, fraction_text(exact_value(expr)), expr)


# ---------------------------------------------------------------------------------------------
# Loaders


@dataclass(frozen=True)
class Preset:
    """A known dataset: hub id, config, split and the (dotted) paths of question and answer in a row."""

    source: str
    subset: str
    split: str
    question_field: str
    answer_field: str
    strip: tuple[str, ...] = ()  # boilerplate removed from every question


PRESETS: dict[str, Preset] = {
    "polaris": Preset("POLARIS-Project/Polaris-Dataset-53K", "", "train", "problem", "answer"),
    # DAPO-Math-17k stores a chat prompt (instructions around the problem) and the answer under reward_model;
    # each problem is repeated many times, and the duplicates are dropped on load.
    "dapo": Preset("BytedTsinghua-SIA/DAPO-Math-17k", "", "train", "prompt.0.content", "reward_model.ground_truth",
                   strip=("Solve the following math problem step by step. The last line of your response should be "
                          "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.",
                          'Remember to put your answer on its own line after "Answer:".')),
    "aime24": Preset("Maxwell-Jia/AIME_2024", "", "train", "Problem", "Answer"),
    "aime25": Preset("yentinglin/aime_2025", "", "train", "problem", "answer"),
    # final_answer is a list of LaTeX strings (several for multi-answer problems; joined with ", ").
    "olympiadbench": Preset("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", "question", "final_answer"),
}

QUESTION_FIELDS = ("problem", "question", "Problem", "Question")
ANSWER_FIELDS = ("answer", "Answer", "final_answer", "ground_truth")


def load_tasks(cfg: Any, where: str) -> list[MathTask]:
    """The (question, answer) pairs of the source described by ``cfg`` (a ``MathSourceConfig``).

    ``where`` names the config node in messages (``env.train``). Raises ConfigError for an unknown
    field, an unreadable source, or a source with no usable row.
    """
    source = str(cfg.source).strip()
    preset = PRESETS.get(source)
    if preset is not None:
        source = preset.source
    subset = cfg.subset or (preset.subset if preset else "")
    split = cfg.split or (preset.split if preset else "train")
    data = read_source(source, subset, split, where)
    columns = list(data.column_names)
    qfield = pick_field(cfg.question_field, preset.question_field if preset else "", QUESTION_FIELDS, columns,
                        where, "question_field")
    afield = pick_field(cfg.answer_field, preset.answer_field if preset else "", ANSWER_FIELDS, columns,
                        where, "answer_field")
    junk = preset.strip if preset else ()

    def pairs() -> Iterator[tuple[str, str]]:
        for row in iter_rows(data.select_columns(sorted({qfield.split(".")[0], afield.split(".")[0]}))):
            question = cell_text(field_value(row, qfield))
            for text in junk:
                question = question.replace(text, "")
            yield question.strip(), cell_text(field_value(row, afield))

    return [MathTask(q, a) for q, a in usable_pairs(pairs(), cfg.limit, where, cfg.source, (qfield, afield),
                                                     len(data))]
