"""Any dataset of prompts and answers as an environment: a Hugging Face dataset or a local JSONL/JSON/Parquet/CSV file,
a column map, and a verifier (``env=dataset env.train.source=gsm8k.jsonl env.columns.prompt=question``).

A task is a row: its prompt (a column or dotted path; a chat list of ``{role, content}`` messages is shown as its
contents), its gold answer and, for code, its tests. An action is the answer text (after the workflow's answer
marker); ``env.extract`` (a regular expression) may pick the answer out of it first (its first group, else the
whole match; no match is a format failure). The verifier decides correctness:

- ``exact``: equal after collapsing whitespace and dropping a final period (case-blind unless ``case_sensitive``);
- ``regex``: the gold cell is a regular expression the answer must match in full (same case rule);
- ``math``: Math-Verify equality (the last ``\\boxed{}`` if any, as ``env=math`` reads answers);
- ``code``: the answer is a Python program (its last fenced block if any) run in the sandbox on the row's tests:
  a list of assert statements (a function problem: the answer runs followed by each assert) or of stdin→stdout
  pairs (``[in, out]`` or ``{input, output}``), or such a list as JSON text. The reward is the share passed.

Rewards: ``correct_reward`` for a right answer (it ends the episode), ``wrong_reward`` for a readable wrong one,
``format_penalty`` for none. ``env.extract`` also picks the gold answer out of a gold cell it matches (GSM8K's
``... #### 72``). Splits never share a prompt: with no ``env.eval.source``, one prompt in
``env.holdout`` (by a hash of its text) is held out of the training rows for evaluation; with one, training rows
whose prompt is also an evaluation prompt are dropped (counted in a warning). Unusable rows (no prompt, no answer
or no tests, tests that do not parse) are skipped and counted by reason; a source with none left is an error.
"""

from __future__ import annotations

import json
import logging
import random
import re
import secrets
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import EnvConfig, bounded
from marl_cli.envs.base import ENVS, WARMSTART_OFFSET, AnswerState, Env, Transition, answer_step
from marl_cli.envs.code import clean_code
from marl_cli.envs.code_data import PASSED, Problem, Test, normalize, passes, test_program
from marl_cli.envs.math_problems import answers_match, extract_answer, parse_math
from marl_cli.envs.sources import cell_text, field_value, iter_rows, local_columns, pick_field, read_source

log = logging.getLogger(__name__)
PROMPT_FIELDS = ("prompt", "question", "problem", "input", "text")
ANSWER_FIELDS = ("answer", "solution", "output", "target", "label")
TEST_FIELDS = ("tests", "test_list", "test_cases")


class Verifier(str, Enum):
    exact = "exact"
    regex = "regex"
    math = "math"
    code = "code"


@dataclass
class DatasetSourceConfig:
    """Where one split's rows come from."""

    source: str = ""  # a hub dataset id or a local .json/.jsonl/.parquet/.csv; eval empty: held out of train
    subset: str = ""  # hub dataset config; empty: the dataset's default
    split: str = ""  # hub split; empty: train (local files are read whole)
    limit: int = bounded(0, ge=0)  # keep the first N usable rows; 0: all


@dataclass
class ColumnMap:
    """Which column (or dotted path: ``prompt.0.content``) holds each part of a task; empty: the usual names."""

    prompt: str = ""  # the question shown to the agent; empty: prompt, question, problem, input or text
    answer: str = ""  # the gold answer (code: a reference program, optional); empty: answer, solution, output, ...
    tests: str = ""  # verifier=code: the tests; empty: tests, test_list or test_cases


@dataclass
class DatasetConfig(EnvConfig):
    """Rows of a dataset checked by a verifier (``env=dataset``)."""

    name: str = "dataset"
    train: DatasetSourceConfig = field(default_factory=DatasetSourceConfig)  # training and warm-start rows
    eval: DatasetSourceConfig = field(default_factory=DatasetSourceConfig)  # held-out rows (empty: from train)
    columns: ColumnMap = field(default_factory=ColumnMap)  # which column holds the prompt, answer, tests
    verifier: Verifier = Verifier.exact  # exact | regex | math | code
    extract: str = ""  # a regular expression that picks the answer out of the answer text; empty: all of it
    case_sensitive: bool = False  # exact and regex verifiers
    holdout: int = bounded(10, ge=2)  # no eval source: one prompt in N (by hash) is held out for evaluation
    rules: str = "Answer the question."  # the rules line shown above every prompt
    correct_reward: float = 1.0  # a right answer (code: every test passes); ends the episode
    wrong_reward: float = 0.0  # a readable wrong answer (code: scaled by the share of tests failed)
    format_penalty: float = -1.0  # no answer, an answer `extract` does not match, or math Math-Verify cannot read


@dataclass(frozen=True)
class DatasetTask:
    """One row: the prompt, the gold answer (empty for a code row without a reference) and the code tests."""

    prompt: str
    answer: str
    tests: tuple[Test, ...] = ()
    function: bool = False


# ---------------------------------------------------------------------------------------------
# Reading rows


def prompt_text(value: Any) -> str:
    """A prompt cell as text: a chat list of messages as their contents, one per line; else the cell's text."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(cell_text(m["content"]) for m in value).strip()
    return cell_text(value)


def parse_tests(value: Any) -> tuple[tuple[Test, ...], bool]:
    """A tests cell as marl's tests and whether they are asserts on a function; ValueError when unreadable."""
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith(("[", "{")):
            return ((text, PASSED),), True  # one block of asserts
        value = json.loads(text)
    if isinstance(value, dict) and {"input", "output"} <= set(value) and isinstance(value["input"], list):
        value = [{"input": i, "output": o} for i, o in zip(value["input"], value["output"], strict=True)]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("no tests")
    if all(isinstance(t, str) for t in value):
        return tuple((t.strip(), PASSED) for t in value if t.strip()), True
    pairs = [(t.get("input"), t.get("output")) if isinstance(t, dict) else tuple(t) if isinstance(t, (list, tuple))
             else () for t in value]
    if not all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        raise ValueError("tests are neither asserts nor (stdin, stdout) pairs")
    return tuple((i, o) for i, o in pairs), False


def row_task(row: dict[str, Any], fields: dict[str, str], code: bool) -> DatasetTask:
    """The task of one row; ValueError naming why the row cannot be one."""
    prompt = prompt_text(field_value(row, fields["prompt"]))
    answer = cell_text(field_value(row, fields["answer"])) if fields["answer"] else ""
    if not prompt:
        raise ValueError("no prompt")
    if not code:
        if not answer:
            raise ValueError("no answer")
        return DatasetTask(prompt, answer)
    try:
        tests, function = parse_tests(field_value(row, fields["tests"]))
    except ValueError as exc:
        raise ValueError(f"unreadable tests ({str(exc)[:40]})") from None
    return DatasetTask(prompt, answer, tests, function)


def gold_answer(task: DatasetTask, pattern: re.Pattern[str] | None) -> DatasetTask:
    """``task`` with its gold answer picked out by ``env.extract`` where the pattern matches it (kept whole else)."""
    found = pattern.search(task.answer) if pattern is not None else None
    if found is None:
        return task
    picked = (found.group(1) if pattern.groups else found.group(0)).strip()
    return replace(task, answer=picked) if picked else task


def column_map(cfg: Any, columns: list[str], where: str) -> dict[str, str]:
    """The column of each task part (a one-line ConfigError for a named column the data lacks)."""
    code = cfg.verifier == Verifier.code
    fields = {"prompt": pick_field(cfg.columns.prompt, "", PROMPT_FIELDS, columns, where, "columns.prompt")}
    if code:
        fields["tests"] = pick_field(cfg.columns.tests, "", TEST_FIELDS, columns, where, "columns.tests")
        given = cfg.columns.answer or next((c for c in ANSWER_FIELDS if c in columns), "")
        fields["answer"] = pick_field(given, "", (), columns, where, "columns.answer") if given else ""
    else:
        fields["answer"] = pick_field(cfg.columns.answer, "", ANSWER_FIELDS, columns, where, "columns.answer")
    return fields


def load_rows(cfg: Any, split: str) -> list[DatasetTask]:
    """The usable, distinct tasks of ``env.<split>``'s source, skipped rows counted by reason in one warning."""
    src = getattr(cfg, split)
    where = f"env.{split}"
    data = read_source(str(src.source), src.subset, src.split or "train", where)
    fields = column_map(cfg, list(data.column_names), f"{where} ({src.source})")
    heads = sorted({f.split(".")[0] for f in fields.values() if f})
    tasks: dict[DatasetTask, None] = {}
    skipped: Counter[str] = Counter()
    gold = re.compile(cfg.extract) if cfg.extract and cfg.verifier != Verifier.code else None
    for row in iter_rows(data.select_columns(heads)):
        try:
            tasks.setdefault(gold_answer(row_task(row, fields, cfg.verifier == Verifier.code), gold))
        except ValueError as exc:
            skipped[str(exc)] += 1
        if src.limit and len(tasks) >= src.limit:
            break
    if skipped:
        log.warning("%s.source=%s: skipped %d rows (%s)", where, src.source, sum(skipped.values()),
                    ", ".join(f"{why}: {n}" for why, n in sorted(skipped.items())))
    if not tasks:
        raise ConfigError(f"{where}.source={src.source!r} has no usable row" + (f" ({dict(skipped)})" if skipped
                                                                                else ""))
    return list(tasks)


def held_out(prompt: str, buckets: int) -> bool:
    """Whether ``prompt`` is an evaluation prompt when evaluation is held out of the training source."""
    return zlib.crc32(prompt.encode()) % buckets == 0


def split_rows(cfg: Any) -> tuple[list[DatasetTask], list[DatasetTask]]:
    """The training and evaluation tasks, sharing no prompt."""
    train = load_rows(cfg, "train")
    if not str(cfg.eval.source).strip():
        evals = [t for t in train if held_out(t.prompt, cfg.holdout)]
        train = [t for t in train if not held_out(t.prompt, cfg.holdout)]
        if not evals or not train:
            raise ConfigError(f"env.holdout={cfg.holdout} leaves {len(train)} training and {len(evals)} evaluation "
                              f"rows of {cfg.train.source}; give env.eval.source or another env.holdout")
        return train, evals
    evals = load_rows(cfg, "eval")
    prompts = {t.prompt for t in evals}
    kept = [t for t in train if t.prompt not in prompts]
    if len(kept) < len(train):
        log.warning("env.train: dropped %d rows whose prompt is also an evaluation prompt", len(train) - len(kept))
    if not kept:
        raise ConfigError("env.train has no row left once the evaluation prompts are dropped")
    return kept, evals


def check_dataset(cfg: Any) -> None:
    """The sources load and have the mapped columns, ``env.extract`` compiles, and code runs in a sandbox."""
    env = cfg.env
    if not str(env.train.source).strip():
        raise ConfigError("env=dataset needs env.train.source (a hub dataset id or a local .jsonl/.json/.parquet/.csv)")
    if env.extract:
        try:
            re.compile(env.extract)
        except re.error as exc:
            raise ConfigError(f"env.extract={env.extract!r} is not a regular expression ({exc})") from None
    for split in ("train", "eval"):
        src = getattr(env, split)
        if str(src.source).strip():
            columns = local_columns(str(src.source)) or list(
                read_source(str(src.source), src.subset, src.split or "train", f"env.{split}").column_names)
            column_map(env, columns, f"env.{split} ({src.source})")


# ---------------------------------------------------------------------------------------------
# The environment


@ENVS.register("dataset", schema=DatasetConfig, check=check_dataset)
class DatasetEnv(Env):
    """Rows of a dataset, answered once per action and checked by ``env.verifier``; the oracle is the gold answer."""

    def __init__(self, cfg: Any, seed: int = 0, sandbox: Any = None):
        super().__init__(cfg, seed, sandbox)
        self.verifier = Verifier(cfg.verifier)
        if self.verifier == Verifier.code and sandbox is None:
            raise ConfigError("env.verifier=code runs programs and needs a sandbox")
        self.pattern = re.compile(cfg.extract) if cfg.extract else None
        self.train_rows, self.eval_rows = split_rows(cfg)
        self.order = random.Random(seed).sample(range(len(self.train_rows)), len(self.train_rows))
        if cfg.eval_size > len(self.eval_rows):
            log.warning("env.eval_size=%d exceeds the %d evaluation rows: rows repeat; set env.eval_size=%d",
                        cfg.eval_size, len(self.eval_rows), len(self.eval_rows))
        self.marker = f"{PASSED}{secrets.token_hex(8)}"

    @classmethod
    def uses_sandbox(cls, cfg: Any) -> bool:
        return cfg.verifier == Verifier.code

    def task(self, split: str, index: int) -> DatasetTask:
        """Evaluation row ``index`` in file order, or a training row in the run's shuffled order (both modulo)."""
        if split == "eval":
            return self.eval_rows[index % len(self.eval_rows)]
        if split == "warmstart":
            index += WARMSTART_OFFSET
        elif split != "train":
            raise ValueError(f"unknown split {split!r}; expected train, warmstart or eval")
        return self.train_rows[self.order[index % len(self.order)]]

    def make_task(self, seed: int) -> DatasetTask:
        return self.train_rows[seed % len(self.train_rows)]

    def rules(self) -> str:
        return self.cfg.rules

    def initial_state(self, task: DatasetTask) -> AnswerState:
        return AnswerState(task=task)

    def observe(self, state: AnswerState) -> str:
        return state.task.prompt

    def oracle(self, state: AnswerState) -> str | None:
        return state.task.answer or None

    def score(self, state: AnswerState) -> float:
        return state.score

    def answer_of(self, action: str | None) -> str | None:
        """The answer ``env.extract`` picks out of ``action`` (None when it does not match)."""
        if action is None or self.pattern is None:
            return action
        found = self.pattern.search(action)
        if found is None:
            return None
        return (found.group(1) if self.pattern.groups else found.group(0)).strip() or None

    def grade(self, task: DatasetTask, answer: str) -> float | None:
        """The share of ``task`` the answer gets right (None: unreadable, a format failure)."""
        if self.verifier == Verifier.code:
            code = clean_code(answer)
            return None if code is None else self.pass_rate(task, code)
        if self.verifier == Verifier.math:
            read = extract_answer(answer)
            return None if read is None or not parse_math(read) else float(answers_match(task.answer, read))
        flags = 0 if self.cfg.case_sensitive else re.IGNORECASE
        if self.verifier == Verifier.regex:
            try:
                return float(re.fullmatch(task.answer, answer.strip(), flags) is not None)
            except re.error:
                return float(exact_text(task.answer, flags) == exact_text(answer, flags))
        return float(exact_text(task.answer, flags) == exact_text(answer, flags))

    def pass_rate(self, task: DatasetTask, code: str) -> float:
        """The share of the row's tests ``code`` passes in the sandbox."""
        problem = Problem("row", task.prompt, task.tests, function=task.function)
        jobs = [test_program(problem, code, test, self.marker) for test in task.tests]
        runs = self.sandbox.run_many(jobs)
        return sum(passes(problem, normalize(run.stdout), run.ok, test, self.marker)
                   for run, test in zip(runs, task.tests, strict=True)) / len(task.tests)

    def step(self, state: AnswerState, action: str | None) -> Transition:
        cfg = self.cfg
        answer = self.answer_of(action)
        share = None if answer is None else self.grade(state.task, answer)
        reward = 0.0 if share is None else cfg.wrong_reward + share * (cfg.correct_reward - cfg.wrong_reward)
        return answer_step(state, answer, share, cfg, reward, {"correct": float(share == 1.0)})


def exact_text(text: str, flags: int) -> str:
    """``text`` as the exact verifier compares it: whitespace collapsed, a final period dropped, case folded."""
    text = " ".join(text.split()).rstrip(".").strip()
    return text.casefold() if flags & re.IGNORECASE else text
