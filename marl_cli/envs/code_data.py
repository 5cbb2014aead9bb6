"""Where code problems come from: the embedded set shipped with marl, and loaders for APPS, CodeContests and LCB.

Every source becomes a list of ``Problem``: a statement, stdin→stdout ground-truth tests, and a golden
(reference) Python solution when the source has one. ``env.train`` and ``env.eval`` each pick a source:

- ``source=embedded`` (default): ``data/code_problems.jsonl`` in this package, 40 tiny problems (30 train,
  10 eval, by its ``split`` column), each with a golden solution and 6–7 tests. ``path`` may name another
  file in the same format (``id, split, statement, solution, tests: [[stdin, stdout], ...]``).
- ``source=apps``: APPS (codeparrot/apps). Columns ``question``, ``solutions`` (a JSON list of Python
  programs) and ``input_output`` (JSON ``{"inputs": [...], "outputs": [...], "fn_name"?}``). The hub repo is
  a loading script, which ``datasets>=4`` no longer runs, so the preset reads its data files directly
  (``hf://datasets/codeparrot/apps/{train,test}.jsonl``). Call-based problems (``fn_name``) are skipped.
- ``source=code_contests``: deepmind/code_contests (parquet). Columns ``description``, ``solutions``
  (``{"language": [...], "solution": [...]}``, golden = the first PYTHON3 one, language 3) and
  ``public_tests``/``private_tests``/``generated_tests`` (``{"input": [...], "output": [...]}``).
- ``source=livecodebench``: livecodebench/code_generation_lite (also a loading script; the preset reads its
  ``test*.jsonl`` files). Columns ``question_content``, ``public_test_cases`` and ``private_test_cases``
  (JSON lists of ``{"input", "output", "testtype"}``; the private ones are often base64(zlib(pickle(json))),
  unpickled here with a loader that refuses every class, so only plain strings can come out). Only ``stdin``
  tests are kept; there are no solutions, so such problems have no golden program.

- ``source=humaneval``: HumanEval (openai/openai_humaneval, its only split ``test`` for both env splits: use
  ``limit`` or a local file to hold problems out). Function completion: columns ``prompt`` (signature and
  docstring), ``canonical_solution``, ``test`` (a ``check(candidate)`` function) and ``entry_point``. The
  statement shows the prompt; the answer is the whole function; its one test runs ``check(<entry_point>)``.
- ``source=mbpp``: MBPP (google-research-datasets/mbpp, ``train``/``test``). Columns ``text``, ``code`` (the
  golden program), ``test_list`` (assert statements, each a test) and ``test_setup_code``; the statement
  shows the first assert, which names the function.

Function problems (humaneval, mbpp) are scored by running the answer followed by each test's check code:
a test passes when the program ends by printing a pass marker (the checks raised nothing). At load, a
problem's golden program must pass its own tests in the sandbox, or the problem is skipped and counted.

``path`` overrides the preset's source: a hub id, an ``hf://`` file or glob, or a local file (.json, .jsonl,
.parquet, .csv) or directory, read through ``datasets.load_dataset``; ``question_field``, ``solutions_field``
and ``tests_field`` rename the columns (a named column that is missing is an error listing the available
ones; the preset's solutions column may be absent, leaving the problems without a golden program). Rows that
cannot be used (bad JSON, no stdin tests, call-based APPS problems) are skipped, counted by reason and logged
once per source.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import pickle
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl_cli.config.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_PATH = Path(__file__).with_name("data") / "code_problems.jsonl"
DATASETS = ("embedded", "apps", "code_contests", "livecodebench", "humaneval", "mbpp")
FUNCTION_DATASETS = ("humaneval", "mbpp")
"""Sources whose problems ask for a function checked by assertions, not a stdin→stdout program."""
PASSED = "__marl_checks_passed__"
"""Starts the line a function problem's test program prints last when every check held; the env adds a
secret of its own (``CodeEnv.marker``), so an answer that prints the marker and exits before the checks
does not pass."""
PYTHON3 = 3
"""CodeContests' language id of Python 3 solutions."""

# dataset → env split → (path, hub split); then the dataset's default columns.
PRESETS: dict[str, dict[str, tuple[str, str]]] = {
    "embedded": {"train": ("", "train"), "eval": ("", "eval")},
    "apps": {"train": ("hf://datasets/codeparrot/apps/train.jsonl", "train"),
             "eval": ("hf://datasets/codeparrot/apps/test.jsonl", "train")},
    "code_contests": {"train": ("deepmind/code_contests", "train"), "eval": ("deepmind/code_contests", "test")},
    "livecodebench": {"train": ("hf://datasets/livecodebench/code_generation_lite/test*.jsonl", "train"),
                      "eval": ("hf://datasets/livecodebench/code_generation_lite/test*.jsonl", "train")},
    "humaneval": {"train": ("openai/openai_humaneval", "test"), "eval": ("openai/openai_humaneval", "test")},
    "mbpp": {"train": ("google-research-datasets/mbpp", "train"), "eval": ("google-research-datasets/mbpp", "test")},
}
COLUMNS: dict[str, tuple[str, str, str]] = {  # (question, solutions, tests: comma-separated)
    "apps": ("question", "solutions", "input_output"),
    "code_contests": ("description", "solutions", "public_tests,private_tests,generated_tests"),
    "livecodebench": ("question_content", "", "public_test_cases,private_test_cases"),
    "humaneval": ("prompt", "canonical_solution", "test"),
    "mbpp": ("text", "code", "test_list"),
}
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

Test = tuple[str, str]


@dataclass(frozen=True)
class Problem:
    """A programming problem: statement, ground-truth tests, golden program (None if unknown).

    ``function`` problems' tests are ``(check code, PASSED)``: the answer runs followed by the check code
    (``test_program``); stdin→stdout problems' tests are ``(stdin, expected stdout)``.
    """

    id: str
    statement: str
    tests: tuple[Test, ...]
    solution: str | None = None
    function: bool = False


def normalize(output: str) -> str:
    """Output as compared: stripped, and every line's runs of whitespace collapsed to one space."""
    return "\n".join(" ".join(line.split()) for line in output.strip().splitlines())


def test_program(problem: Problem, code: str, test: Test, marker: str = PASSED) -> tuple[str, str]:
    """The ``(program, stdin)`` that runs ``code`` on ``test``: as is on the test's stdin, or (function
    problems) followed by the test's checks and the pass ``marker``, on an empty stdin."""
    if not problem.function:
        return code, test[0]
    return f"{code}\n\n{test[0]}\nprint({marker!r})\n", ""


def passes(problem: Problem, output: str, ok: bool, test: Test, marker: str = PASSED) -> bool:
    """Whether a run's normalised ``output`` passes ``test``: the expected stdout, or (function problems)
    ending with the pass ``marker`` (the answer's own prints may come first)."""
    if problem.function:
        return ok and output.rsplit("\n", 1)[-1] == marker
    return ok and output == normalize(test[1])


@dataclass
class ProblemSet:
    """The usable problems of one source, and how many rows were skipped for which reason."""

    problems: list[Problem]
    skipped: dict[str, int] = field(default_factory=dict)
    source: str = ""


class SkipRow(ValueError):
    """A row that cannot become a problem; the message is the reason it is counted under."""


# ---------------------------------------------------------------------------------------------
# Loading


def load_problems(src: Any, where: str) -> ProblemSet:
    """The problems of ``src`` (a ``CodeSourceConfig``) for the env split ``where`` ("train" or "eval")."""
    dataset = str(src.source)
    if dataset not in DATASETS:
        raise ConfigError(f"env.{where}.source={dataset!r} is unknown; choose from: {', '.join(DATASETS)}")
    if src.limit < 0:
        raise ConfigError(f"env.{where}.limit must be non-negative, got {src.limit}")
    preset_path, preset_split = PRESETS[dataset][where]
    path, split = str(src.path or preset_path), str(src.split or preset_split)
    if dataset == "embedded":
        result = _load_embedded(path, split, where, src.limit)
    else:
        rows = _read_rows(path, split, where)
        result = _convert(rows, dataset, src, where, path)
    if result.skipped:
        log.warning("env.%s: skipped %d rows of %s (%s)", where, sum(result.skipped.values()), result.source,
                    ", ".join(f"{reason}: {n}" for reason, n in sorted(result.skipped.items())))
    if not result.problems:
        raise ConfigError(f"env.{where}: {result.source} has no usable problem"
                          + (f" (skipped: {dict(result.skipped)})" if result.skipped else ""))
    return result


def _load_embedded(path: str, split: str, where: str, limit: int) -> ProblemSet:
    file = Path(path).expanduser() if path else EMBEDDED_PATH
    if not file.is_file():
        raise ConfigError(f"env.{where}.path={path!r} is not a file")
    problems: list[Problem] = []
    skipped: Counter[str] = Counter()
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("split", split) != split:
                continue
            tests = tuple((_text(i), _text(o)) for i, o in row["tests"])
            if not tests:
                raise SkipRow("no tests")
            problems.append(Problem(str(row.get("id", n)), str(row["statement"]), tests, row.get("solution")))
        except SkipRow as exc:
            skipped[str(exc)] += 1
        except (ValueError, KeyError, TypeError, AttributeError):
            skipped["malformed row"] += 1
        if limit and len(problems) >= limit:
            break
    return ProblemSet(problems, dict(skipped), f"{file} [{split}]")


def _read_rows(path: str, split: str, where: str) -> Any:
    """A streamed ``datasets`` split from a local file/dir, an hf:// file or glob, or a hub id.

    Streaming reads only the rows used (``limit``), not the whole file (APPS' test file is over a GB).
    """
    from datasets import load_dataset

    local = Path(path).expanduser()
    builder = _BUILDERS.get(local.suffix.lower())
    try:
        if local.is_dir():
            return load_dataset(str(local), split=split, streaming=True)
        if builder and (local.is_file() or "://" in path or "*" in path):
            return load_dataset(builder, data_files=path, split="train", streaming=True)
        if local.suffix and local.suffix.lower() in _BUILDERS and not local.exists():
            raise ConfigError(f"env.{where}.path={path!r}: no such file")
        return load_dataset(path, split=split, streaming=True)
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many kinds (network, format, missing split)
        detail = " ".join(str(exc).split())[:300]
        raise ConfigError(f"env.{where}: cannot load {path!r} (split {split!r}): {type(exc).__name__}: "
                          f"{detail}") from exc


def _columns(dataset: str, src: Any, where: str, available: list[str]) -> tuple[str, str, list[str]]:
    question, solutions, tests = COLUMNS[dataset]
    question = src.question_field or question
    if not src.solutions_field and solutions not in available:
        solutions = ""  # the preset's solutions column is optional: without it problems have no golden program
    solutions = src.solutions_field or solutions
    test_cols = [c.strip() for c in (src.tests_field or tests).split(",") if c.strip()]
    for key, names in (("question_field", [question]), ("solutions_field", [solutions] if solutions else []),
                       ("tests_field", test_cols)):
        for name in names:
            if name not in available:
                raise ConfigError(f"env.{where}.{key}: column {name!r} is not in the {dataset} source; "
                                  f"available columns: {', '.join(available)}")
    return question, solutions, test_cols


def _convert(rows: Any, dataset: str, src: Any, where: str, path: str) -> ProblemSet:
    columns = rows.column_names
    if columns is None:  # a stream whose features are unknown until read
        columns = list(next(iter(rows), {}))
    question, solutions, test_cols = _columns(dataset, src, where, list(columns))
    parse = {"apps": _apps_row, "code_contests": _code_contests_row, "livecodebench": _livecodebench_row,
             "humaneval": _humaneval_row, "mbpp": _mbpp_row}[dataset]
    function = dataset in FUNCTION_DATASETS
    problems: list[Problem] = []
    skipped: Counter[str] = Counter()
    for n, row in enumerate(rows):
        try:
            statement = row[question]
            if not isinstance(statement, str) or not statement.strip():
                raise SkipRow("no statement")
            tests, golden = parse(row, solutions, test_cols)
            if not tests:
                raise SkipRow("no tests" if function else "no stdin tests")
            if function:
                statement, golden = _function_statement(dataset, row, statement, tests, golden)
            problems.append(Problem(f"{dataset}:{n}", statement.strip(), tuple(tests), golden, function))
        except SkipRow as exc:
            skipped[str(exc)] += 1
        if src.limit and len(problems) >= src.limit:
            break
    return ProblemSet(problems, dict(skipped), path)


# ---------------------------------------------------------------------------------------------
# Row formats


def _text(value: Any) -> str:
    """A test's stdin or stdout as text (lists of lines are joined), ending with a newline unless empty."""
    if isinstance(value, list):
        value = "\n".join(map(str, value))
    elif not isinstance(value, str):
        raise SkipRow("test is not text")
    return value if not value or value.endswith("\n") else value + "\n"


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise SkipRow(f"bad {what} JSON") from None


def _apps_row(row: dict[str, Any], solutions: str, test_cols: list[str]) -> tuple[list[Test], str | None]:
    tests: list[Test] = []
    for col in test_cols:
        io_spec = _json(row[col], col) if row[col] else {}
        if not isinstance(io_spec, dict):
            raise SkipRow(f"bad {col} JSON")
        if io_spec.get("fn_name"):
            raise SkipRow("call-based (fn_name)")
        inputs, outputs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
        tests += [(_text(i), _text(o)) for i, o in zip(inputs, outputs, strict=False)]
    golden = None
    if solutions and row[solutions]:
        try:
            found = _json(row[solutions], solutions)
        except SkipRow:
            found = None  # a problem without a usable golden program is still scored on its tests
        if isinstance(found, list) and found and isinstance(found[0], str):
            golden = found[0]
    return tests, golden


def _code_contests_row(row: dict[str, Any], solutions: str, test_cols: list[str]) -> tuple[list[Test], str | None]:
    tests: list[Test] = []
    for col in test_cols:
        spec = _json(row[col], col) if row[col] else {}
        if not isinstance(spec, dict):
            raise SkipRow(f"bad {col}")
        tests += [(_text(i), _text(o)) for i, o in zip(spec.get("input") or [], spec.get("output") or [], strict=False)]
    golden = None
    sols = _json(row[solutions], solutions) if solutions and row[solutions] else {}
    if isinstance(sols, dict):
        for lang, code in zip(sols.get("language") or [], sols.get("solution") or [], strict=False):
            if lang == PYTHON3 and isinstance(code, str) and code.strip():
                golden = code
                break
    return tests, golden


class _NoClasses(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused (no code can run)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _lcb_cases(value: Any, col: str) -> list[Any]:
    if not value:
        return []
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise SkipRow(f"bad {col}")
    text = value.lstrip()
    if not text.startswith("["):  # the compressed private tests: base64(zlib(pickle(json text)))
        try:
            text = _NoClasses(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
        except Exception:
            raise SkipRow(f"bad {col} encoding") from None
    cases = _json(text, col)
    if not isinstance(cases, list):
        raise SkipRow(f"bad {col} JSON")
    return cases


def _livecodebench_row(row: dict[str, Any], solutions: str, test_cols: list[str]) -> tuple[list[Test], str | None]:
    tests: list[Test] = []
    for col in test_cols:
        for case in _lcb_cases(row[col], col):
            if isinstance(case, dict) and case.get("testtype", "stdin") == "stdin":
                tests.append((_text(case.get("input", "")), _text(case.get("output", ""))))
    golden = None
    if solutions and isinstance(row[solutions], str) and row[solutions].strip():
        golden = row[solutions]
    return tests, golden


def _humaneval_row(row: dict[str, Any], solutions: str, test_cols: list[str]) -> tuple[list[Test], str | None]:
    entry = row.get("entry_point")
    check = row[test_cols[0]] if test_cols else None
    if not isinstance(entry, str) or not entry.isidentifier() or not isinstance(check, str) or not check.strip():
        raise SkipRow("no check or entry_point")
    golden = row[solutions] if solutions and isinstance(row[solutions], str) else None
    return [(f"{check}\ncheck({entry})", PASSED)], golden


def _mbpp_row(row: dict[str, Any], solutions: str, test_cols: list[str]) -> tuple[list[Test], str | None]:
    setup = row.get("test_setup_code") or ""
    asserts = [a for col in test_cols for a in (row[col] or []) if isinstance(a, str) and a.strip()]
    golden = row[solutions] if solutions and isinstance(row[solutions], str) and row[solutions].strip() else None
    return [(f"{setup}\n{a}".strip(), PASSED) for a in asserts], golden


def _function_statement(dataset: str, row: dict[str, Any], statement: str, tests: list[Test],
                        golden: str | None) -> tuple[str, str | None]:
    """A function problem's statement as the model sees it, and its golden program as a whole."""
    if dataset == "humaneval":  # the prompt is the function's head; the golden body completes it
        return (f"Complete this Python function. Answer with the whole function in a ```python block.\n\n"
                f"```python\n{statement.rstrip()}\n```"), (statement + golden if golden else None)
    first = tests[0][0].rsplit("\n", 1)[-1]
    return (f"{statement.strip()}\nWrite the Python function in a ```python block. It must pass tests such as:\n"
            f"{first}"), golden
