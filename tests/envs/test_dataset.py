"""env=dataset: rows of a local file through a column map, checked by each verifier against the library or rule that
defines it (Math-Verify's own verify, Python's re, the sandbox's runs); splits that never share a prompt; unusable
rows counted; bad column maps and sources refused in one line; a tiny run that trains and evaluates."""

import json
import random
import re
from pathlib import Path

import pytest
from math_verify import parse, verify
from omegaconf import OmegaConf

from marl_cli.envs.dataset import DatasetConfig, DatasetEnv, exact_text, parse_tests
from marl_cli.envs.math_problems import extract_answer
from marl_cli.sandbox import Sandbox
from marl_cli.training.loop import train
from tests.helpers import FAST, refusal, train_config

ARITHMETIC = "examples/datasets/arithmetic.jsonl"


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def env_of(source: str, sandbox=None, **settings) -> DatasetEnv:
    columns = settings.pop("columns", {})
    cfg = OmegaConf.structured(DatasetConfig(**settings))
    cfg.train.source = source
    cfg.columns = OmegaConf.merge(cfg.columns, columns)
    return DatasetEnv(cfg, seed=1, sandbox=sandbox)


def candidates(gold: str, rng: random.Random, others: list[str]) -> list[str | None]:
    """Right, reformatted, wrong and malformed answers to ``gold``."""
    return [gold, f"\\boxed{{{gold}}}", f" {gold}. ", str(int(gold) + rng.choice([-2, -1, 1, 7])), rng.choice(others),
            "", "blah", "\\boxed{", "1/0", "x" * 400, None, f"{gold}0", f"-{gold}"]


def test_math_reward_is_math_verifys_own_verdict_on_thousands_of_pairs():
    env = env_of(ARITHMETIC, verifier="math")
    rng = random.Random(0)
    golds = [t.answer for t in env.train_rows]
    checked = {"right": 0, "wrong": 0, "malformed": 0}
    for task in env.train_rows[:200]:
        state = env.initial_state(task)
        for answer in candidates(task.answer, rng, golds):
            step = env.step(state, answer)
            read = extract_answer(answer)  # marl's reading (env=math's): the last \\boxed{}, else the text
            ours = parse(f"${read}$") if read else []
            if not ours:
                assert not step.format_ok and step.reward == -1.0
                checked["malformed"] += 1
                continue
            truth = verify(parse(f"${task.answer}$"), ours)
            assert step.success == truth and step.reward == (1.0 if truth else 0.0), (task, answer)
            checked["right" if truth else "wrong"] += 1
    assert sum(checked.values()) >= 2500 and min(checked.values()) >= 300, checked


def test_exact_and_regex_verifiers_follow_their_rule_and_extract_picks_the_answer(tmp_path):
    rows = [{"q": f"Capital {i}?", "a": f"City {i}"} for i in range(30)] + [{"q": "Colour?", "a": "gr[ae]y"}]
    source = write(tmp_path / "qa.jsonl", rows)
    exact = env_of(source, holdout=2, columns={"prompt": "q", "answer": "a"})
    task = next(t for t in exact.train_rows + exact.eval_rows if t.prompt == "Capital 3?")
    state = exact.initial_state(task)
    assert [exact.step(state, a).success for a in ("city  3.", "City 3", "City 30", "City")] == [True, True, False,
                                                                                                  False]
    strict = env_of(source, holdout=2, columns={"prompt": "q", "answer": "a"}, case_sensitive=True)
    assert not strict.step(strict.initial_state(task), "city 3").success
    regex = env_of(source, holdout=2, columns={"prompt": "q", "answer": "a"}, verifier="regex")
    colour = regex.initial_state(next(t for t in regex.train_rows + regex.eval_rows if t.prompt == "Colour?"))
    for answer in ("grey", "GRAY", "green", "grey!", "gr[ae]y"):
        assert regex.step(colour, answer).success == (re.fullmatch("gr[ae]y", answer, re.I) is not None)
    picked = env_of(source, holdout=2, columns={"prompt": "q", "answer": "a"}, extract=r"Answer:\s*(.+)")
    step = picked.step(picked.initial_state(task), "I think so. Answer: City 3")
    assert step.success and not picked.step(picked.initial_state(task), "City 3").format_ok
    assert exact_text(" A  b. ", re.I) == "a b"
    worked = write(tmp_path / "gsm.jsonl", [{"question": f"q{i}", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
                                            for i in range(20)])
    gsm = env_of(worked, holdout=2, extract="#### (.+)", verifier="math")
    task = gsm.train_rows[0]
    assert task.answer == str(int(task.prompt[1:]) + 1)
    assert gsm.step(gsm.initial_state(task), f"#### {task.answer}").success


def test_a_chat_prompt_and_a_dotted_path_are_read(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i}+1?"}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(20)]
    env = env_of(write(tmp_path / "chat.jsonl", rows), holdout=2, columns={"answer": "reward_model.ground_truth"})
    task = env.train_rows[0]
    assert task.prompt.startswith("Be brief.\n") and task.prompt.endswith("+1?")
    assert int(task.answer) == int(task.prompt.split("\n")[1].split("+")[0]) + 1


def test_splits_never_share_a_prompt(tmp_path):
    env = env_of(ARITHMETIC)
    train, evals = {t.prompt for t in env.train_rows}, {t.prompt for t in env.eval_rows}
    assert not train & evals and len(train) + len(evals) == 600 and 30 < len(evals) < 90
    assert {env.task("eval", i).prompt for i in range(200)} <= evals
    assert {env.task(split, i).prompt for split in ("train", "warmstart") for i in range(500)} <= train
    rows = [json.loads(line) for line in Path(ARITHMETIC).read_text().splitlines()]
    source = write(tmp_path / "eval.jsonl", rows[:50])
    cfg = OmegaConf.structured(DatasetConfig())
    cfg.train.source, cfg.eval.source = ARITHMETIC, source
    given = DatasetEnv(cfg, seed=0)
    held = {r["question"] for r in rows[:50]}
    assert len(given.train_rows) == 550 and not {t.prompt for t in given.train_rows} & held


def test_unusable_rows_are_skipped_and_counted(tmp_path, caplog):
    rows = [{"question": "a?", "answer": "1"}, {"question": "", "answer": "2"}, {"question": "c?", "answer": None},
            {"question": "a?", "answer": "1"}] + [{"question": f"q{i}?", "answer": str(i)} for i in range(20)]
    env = env_of(write(tmp_path / "rows.jsonl", rows), holdout=2)
    assert len(env.train_rows) + len(env.eval_rows) == 21
    assert "skipped 2 rows (no answer: 1, no prompt: 1)" in caplog.text


def test_a_local_files_columns_are_what_datasets_reads_and_a_source_loads_once(tmp_path, monkeypatch):
    """The config check reads a local file's columns without ``datasets`` (a second of imports less on a refused
    start): the same columns ``datasets`` gives, or None (then ``datasets`` reads it and says what is wrong)."""
    from datasets import load_dataset

    from marl_cli.config.errors import ConfigError
    from marl_cli.envs.sources import local_columns, read_source

    rows = [{"q": "1+1", "a": 2}, {"q": "2+2", "a": 4, "note": "x"}]
    files = {"rows.jsonl": "\n".join(json.dumps(r) for r in rows) + "\n\n", "rows.json": json.dumps(rows),
             "rows.csv": "q,a,note\n1+1,2,\n2+2,4,x\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        builder = "csv" if name.endswith(".csv") else "json"
        expected = load_dataset(builder, data_files=str(tmp_path / name), split="train").column_names
        assert local_columns(str(tmp_path / name)) == expected == ["q", "a", "note"]
    (tmp_path / "renamed.csv").write_text("q,q,\n1,2,3\n")  # pandas renames: datasets decides the columns
    assert local_columns(str(tmp_path / "renamed.csv")) is None
    monkeypatch.setattr("marl_cli.envs.sources.LOCAL_COLUMNS_MAX_BYTES", 10)  # a big file: datasets reads it
    assert local_columns(str(tmp_path / "rows.jsonl")) is None
    monkeypatch.undo()
    (tmp_path / "broken.jsonl").write_text('{"q": 1}\n{"q": \n')
    assert local_columns(str(tmp_path / "broken.jsonl")) is None and local_columns("openai/gsm8k") is None
    with pytest.raises(ConfigError, match="broken.jsonl' could not be loaded"):
        read_source(str(tmp_path / "broken.jsonl"), "", "train", "env.train")
    first = read_source(str(tmp_path / "rows.jsonl"), "", "train", "env.train")
    assert read_source(str(tmp_path / "rows.jsonl"), "", "train", "env.train") is first  # the check's read, reused
    (tmp_path / "rows.jsonl").write_text(json.dumps({"q": "3+3", "a": 6}) + "\n")
    assert read_source(str(tmp_path / "rows.jsonl"), "", "train", "env.train")["q"] == ["3+3"]  # changed: read again


def test_tests_cells_read_as_asserts_or_stdin_pairs():
    assert parse_tests(["assert f(1) == 2", " "]) == ((("assert f(1) == 2", "__marl_checks_passed__"),), True)
    assert parse_tests('[{"input": "1\\n", "output": "2\\n"}]') == ((("1\n", "2\n"),), False)
    assert parse_tests({"input": ["1", "2"], "output": ["a", "b"]}) == ((("1", "a"), ("2", "b")), False)
    for bad in ([], "[1, 2]", [{"input": 1}], "{not json"):
        with pytest.raises(ValueError):
            parse_tests(bad)


def test_code_reward_is_the_share_of_tests_the_sandbox_passes(tmp_path):
    rows = [{"prompt": "Write f(x) returning x + 1.", "tests": ["assert f(1) == 2", "assert f(-1) == 0"]},
            {"prompt": "Print the sum of two numbers on a line.",
             "tests": [["1 2\n", "3\n"], ["5 5\n", "10\n"], ["0 0\n", "0\n"]]}] * 2
    rows[2:] = [{"prompt": "Write g() returning 7.", "tests": ["assert g() == 7"]},
                {"prompt": "Write h(s) returning s twice.", "tests": ["assert h('a') == 'aa'"]}]
    cfg = OmegaConf.structured(DatasetConfig(verifier="code", eval_size=1))
    cfg.train.source = write(tmp_path / "code.jsonl", rows)
    cfg.eval.source = write(tmp_path / "held.jsonl", [{"prompt": "Write k() returning 1.", "tests": ["assert k()"]}])
    env = DatasetEnv(cfg, seed=0, sandbox=Sandbox())
    by_prompt = {t.prompt: env.initial_state(t) for t in env.train_rows}
    f = by_prompt["Write f(x) returning x + 1."]
    assert env.step(f, "```python\ndef f(x):\n    return x + 1\n```").reward == 1.0
    assert env.step(f, "def f(x):\n    return 0").reward == pytest.approx(0.5)  # f(-1) == 0 holds
    assert env.step(f, "print('__marl_checks_passed__')\nraise SystemExit").reward == 0.0  # the marker is secret
    assert not env.step(f, "```python\n```").format_ok
    add = by_prompt["Print the sum of two numbers on a line."]
    assert env.step(add, "a, b = map(int, input().split())\nprint(a + b)").success
    assert env.step(add, "print(0)").reward == pytest.approx(1 / 3)


@pytest.mark.parametrize("overrides, message", [
    ([], "env=dataset needs env.train.source"),
    (["env.train.source=nowhere.jsonl"], "env.train.source='nowhere.jsonl': no such file"),
    ([f"env.train.source={ARITHMETIC}", "env.columns.prompt=prompt_text"],
     "env.train (examples/datasets/arithmetic.jsonl).columns.prompt='prompt_text' is not a column; columns: question, "
     "answer"),
    ([f"env.train.source={ARITHMETIC}", "env.verifier=code"], "columns.tests is not set and none of tests"),
    ([f"env.train.source={ARITHMETIC}", "env.extract='(unclosed'"], "env.extract='(unclosed' is not a regular"),
    ([f"env.train.source={ARITHMETIC}", "env.verifier=fuzzy"], "env.verifier"),
])
def test_bad_dataset_setups_fail_in_one_line(overrides, message):
    assert message in refusal(["env=dataset", "workflow=single_agent", *overrides])


def test_a_dataset_run_trains_and_evaluates(tmp_path):
    fast = [o for o in FAST if not o.startswith("env.size")]
    summary = train(train_config(*fast, "env=dataset", f"env.train.source={ARITHMETIC}", "env.verifier=math",
                                 "trainer.steps=1", "trainer.warmstart.enabled=true",
                                 "trainer.warmstart.num_examples=16"), tmp_path)
    assert summary["status"] == "completed" and 0.0 <= summary["eval/success"] <= 1.0
