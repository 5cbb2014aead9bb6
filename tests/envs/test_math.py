import json
import logging
import re
from fractions import Fraction

import pytest
from datasets import Dataset

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import MathConfig, MathSourceConfig
from marl_cli.envs import math_data
from marl_cli.envs.math_data import PRESETS, MathTask, exact_value, held_out
from marl_cli.envs.math_problems import MathEnv, answers_match, extract_answer, last_boxed
from marl_cli.envs.sources import cell_text


def make_env(seed: int = 0, **kw) -> MathEnv:
    return MathEnv(MathConfig(**{"actions_per_episode": 1, **kw}), seed)


def play(gold: str, action: str | None, **kw):
    env = make_env(**kw)
    return env.step(env.initial_state(MathTask("q", gold)), action)


# --- answers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gold,answer", [
    ("1/2", "0.5"), ("1/2", "\\frac{1}{2}"), ("0.5", "1/2"), ("\\frac{1}{2}", "2/4"),
    ("2x+1", "1+2x"), ("2x+1", "2*x + 1"), ("2x+1", "x*2+1"),
    ("12", "\\boxed{12}"), ("\\boxed{12}", "12"), ("12", "12.0"), ("12", "The answer is \\boxed{12}."),
    ("5", "x = 5"), ("31/2", "15.5"), ("-6", "$-6$"), ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
])
def test_equivalent_answers_are_correct(gold, answer):
    t = play(gold, answer)
    assert t.format_ok and t.success and t.done
    assert t.reward == 1.0
    assert t.info == {"correct": 1.0}


@pytest.mark.parametrize("gold,answer", [
    ("12", "13"), ("1/3", "0.33"), ("2x+1", "2x+2"), ("1/2", "2"), ("12", "\\boxed{13}"), ("7", "-7"),
])
def test_different_answers_are_wrong(gold, answer):
    t = play(gold, answer)
    assert t.format_ok and not t.success
    assert t.reward == 0.0
    assert t.info == {"correct": 0.0}


@pytest.mark.parametrize("action", [None, "", "   ", "???", "}{", "\\boxed{12", "\\boxed{}", "1" * 400])
def test_missing_or_unreadable_answer_is_a_format_failure(action):
    t = play("12", action, actions_per_episode=3)
    assert not t.format_ok and not t.success and not t.done
    assert t.reward == -1.0
    assert t.state.answer is None and t.state.actions == 1


def test_extract_answer():
    assert extract_answer("so \\boxed{1} then \\boxed{\\frac{3}{4}}.") == "\\frac{3}{4}"
    assert extract_answer("  42. ") == "42"
    assert extract_answer("$7$") == "7"
    assert extract_answer("\\fbox{9}") == "9"
    assert extract_answer("\\boxed{12") is None
    assert extract_answer(None) is None
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert last_boxed("no box") is None


def test_bare_numbers_are_read_as_text_and_bare_latex_as_math():
    assert not answers_match("0", "1 000") and answers_match("1000", "1 000")  # not 1·0
    assert answers_match("1000", "1,000") and not answers_match("0", "1,22")  # not the set {1, 22}
    assert answers_match("2\\sqrt{2}", "2\\sqrt{2}") and not answers_match("2", "2\\sqrt{2}")
    assert answers_match("1000", "10^{3}") and answers_match("-3", "-3")


def test_answers_match_is_symmetric_on_examples():
    assert answers_match("0.5", "1/2") and answers_match("1/2", "0.5")
    assert not answers_match("12", "13")
    assert answers_match("Yes", "yes")  # not math: compared as normalised text


# --- episodes --------------------------------------------------------------------------------------


def test_wrong_answer_continues_until_the_last_action():
    env = make_env(actions_per_episode=2)
    state = env.initial_state(MathTask("What is 3 + 4?", "7"))
    first = env.step(state, "8")
    assert not first.done and first.state.answer == "8" and not first.state.correct
    assert env.score(first.state) == 0.0
    second = env.step(first.state, "9")
    assert second.done and not second.success and second.reward == 0.0
    assert state.actions == 0 and state.answer is None  # states are immutable


def test_correct_answer_scores_one_and_ends():
    env = make_env(actions_per_episode=3)
    state = env.initial_state(MathTask("What is 3 + 4?", "7"))
    t = env.step(state, "\\boxed{7}")
    assert t.done and t.success and env.score(t.state) == 1.0
    assert env.oracle(state) == "7"
    assert env.observe(state) == "What is 3 + 4?"


def test_rewards_are_configurable():
    assert play("7", "7", correct_reward=2.0).reward == 2.0
    assert play("7", "8", wrong_reward=-0.5).reward == -0.5
    assert play("7", None, format_penalty=-3.0).reward == -3.0


def test_oracle_answers_solve_embedded_tasks():
    env = make_env()
    for split in ("train", "eval", "warmstart"):
        for i in range(30):
            state = env.initial_state(env.task(split, i))
            t = env.step(state, env.oracle(state))
            assert t.success, env.task(split, i)


# --- the embedded generator ------------------------------------------------------------------------


def test_embedded_tasks_are_deterministic():
    a, b = make_env(seed=3), make_env(seed=3)
    assert [a.task("train", i) for i in range(50)] == [b.task("train", i) for i in range(50)]
    assert [a.task("train", i) for i in range(50)] != [make_env(seed=4).task("train", i) for i in range(50)]
    assert [a.task("eval", i) for i in range(50)] == [make_env(seed=4).task("eval", i) for i in range(50)]


def test_embedded_train_and_eval_questions_are_disjoint():
    env = make_env()
    train = {env.task("train", i).question for i in range(3000)} | {env.task("warmstart", i).question
                                                                   for i in range(1000)}
    evals = {env.task("eval", i).question for i in range(300)}
    assert len(evals) > 200
    assert not train & evals
    assert all(held_out(q) for q in evals) and not any(held_out(q) for q in train)


def test_embedded_answers_are_right():
    env = make_env(max_operand=12)
    kinds = set()
    for i in range(400):
        task = env.task("train", i)
        value = Fraction(task.answer)
        assert exact_value(task.expr) == value
        if "/" not in task.expr:  # plain Python agrees on integer expressions
            assert eval(task.expr) == value
        if task.question.startswith("What is"):
            kinds.add("arithmetic")
            assert eval(task.question[len("What is "):-1]) == pytest.approx(float(value))
        elif task.question.startswith("Solve"):
            kinds.add("linear")
            a, sign, b, c = re.fullmatch(r"Solve (\d+)x ([+-]) (\d+) = (\d+)\.", task.question).groups()
            lhs = int(a) * value + (int(b) if sign == "+" else -int(b))
            assert lhs == int(c)
        else:
            kinds.add("word")
        numbers = [int(n) for n in re.findall(r"\d+", task.question)]
        assert numbers and min(numbers) >= 0
    assert kinds == {"arithmetic", "linear", "word"}


def test_embedded_kinds_and_difficulty():
    env = make_env(kinds=["linear"], max_operand=5)
    for i in range(50):
        task = env.task("train", i)
        a, _, b, _ = re.fullmatch(r"Solve (\d+)x ([+-]) (\d+) = (\d+)\.", task.question).groups()
        assert 2 <= int(a) <= 5 and 1 <= int(b) <= 5
    for i in range(50):
        assert all(int(n) <= 5 for n in re.findall(r"\d+", make_env(kinds=["arithmetic"], max_operand=5)
                                                    .task("train", i).question))


@pytest.mark.parametrize("kw,message", [
    ({"max_operand": 1}, "env.max_operand"), ({"kinds": ["geometry"]}, "env.kinds"), ({"kinds": []}, "env.kinds"),
])
def test_bad_generator_config(kw, message):
    with pytest.raises(ConfigError, match=message):
        make_env(**kw)


# --- loaded datasets -------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


ROWS = [{"problem": f"What is {i} + 1?", "answer": str(i + 1), "difficulty": 0.5} for i in range(20)]


def test_local_jsonl_skips_malformed_rows(tmp_path, caplog):
    rows = [*ROWS[:3], {"problem": "no answer here", "difficulty": 1.0}, {"problem": "empty", "answer": " "},
            {"answer": "5"}, *ROWS[3:5], ROWS[0]]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="marl_cli.envs.math_data"):
        tasks = math_data.load_tasks(MathSourceConfig(source=path), "env.train")
    assert [t.question for t in tasks] == [r["problem"] for r in ROWS[:5]]  # malformed skipped, duplicate dropped
    assert tasks[0] == MathTask("What is 0 + 1?", "1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "skipped 3 of 9 rows" in warnings[0] and "rows 3, 4, 5" in warnings[0]


def test_wrong_field_names_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(ConfigError, match=r"env.train.question_field='question' is not a column; "
                                          r"columns: problem, answer, difficulty"):
        math_data.load_tasks(MathSourceConfig(source=path, question_field="question"), "env.train")
    with pytest.raises(ConfigError, match=r"env.eval.answer_field='solution' is not a column"):
        MathEnv(MathConfig(eval=MathSourceConfig(source=path, answer_field="solution")))


def test_fields_are_guessed_when_unset(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"Question": "1+1?", "final_answer": ["2"], "id": 1}])
    assert math_data.load_tasks(MathSourceConfig(source=path), "env.train") == [MathTask("1+1?", "2")]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "1+1?", "label": "2"}])
    with pytest.raises(ConfigError, match="columns: text, label"):
        math_data.load_tasks(MathSourceConfig(source=bad), "env.train")


def test_nested_fields_lists_and_numbers(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Find x."}], "reward_model": {"ground_truth": 3}},
            {"prompt": [], "reward_model": {"ground_truth": 4}},
            {"prompt": [{"role": "user", "content": "Find y."}], "reward_model": {"ground_truth": ["1", "2"]}}]
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    cfg = MathSourceConfig(source=str(path), question_field="prompt.0.content",
                           answer_field="reward_model.ground_truth")
    assert math_data.load_tasks(cfg, "env.train") == [MathTask("Find x.", "3")]
    assert cell_text(["1", "2"]) == "1, 2" and cell_text(4.0) == "4"


def test_parquet_and_csv_files(tmp_path):
    Dataset.from_list(ROWS).to_parquet(str(tmp_path / "t.parquet"))
    (tmp_path / "t.csv").write_text("question,answer\nWhat is 2*3?,6\nWhat is 1/2?,0.5\n")
    assert len(math_data.load_tasks(MathSourceConfig(source=str(tmp_path / "t.parquet")), "env.train")) == 20
    tasks = math_data.load_tasks(MathSourceConfig(source=str(tmp_path / "t.csv")), "env.train")
    assert tasks == [MathTask("What is 2*3?", "6"), MathTask("What is 1/2?", "0.5")]


def test_missing_file_and_empty_source(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        math_data.load_tasks(MathSourceConfig(source=str(tmp_path / "nope.jsonl")), "env.train")
    path = write_jsonl(tmp_path / "empty.jsonl", [{"problem": "x", "answer": ""}])
    with pytest.raises(ConfigError, match="has no row"):
        math_data.load_tasks(MathSourceConfig(source=path), "env.train")


def test_limit(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    assert len(math_data.load_tasks(MathSourceConfig(source=path, limit=7), "env.train")) == 7


def test_train_on_one_file_and_evaluate_on_another(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"Problem": f"E{i}", "Answer": i} for i in range(5)])
    cfg = dict(train=MathSourceConfig(source=train), eval=MathSourceConfig(source=evals, question_field="Problem"),
               actions_per_episode=1)
    env = MathEnv(MathConfig(**cfg), seed=0)
    # eval: file order, modulo the length
    assert [env.task("eval", i).question for i in range(7)] == ["E0", "E1", "E2", "E3", "E4", "E0", "E1"]
    assert env.task("eval", 3).answer == "3"
    # train: a permutation of the file, fixed by the run seed
    first = [env.task("train", i).question for i in range(20)]
    assert sorted(first) == sorted(r["problem"] for r in ROWS) and first != [r["problem"] for r in ROWS]
    assert [env.task("train", i + 20).question for i in range(20)] == first
    assert first == [MathEnv(MathConfig(**cfg), seed=0).task("train", i).question for i in range(20)]
    assert first != [MathEnv(MathConfig(**cfg), seed=1).task("train", i).question for i in range(20)]
    assert env.task("warmstart", 0) in [env.task("train", i) for i in range(20)]
    # the embedded generator still serves a split left at its default
    mixed = MathEnv(MathConfig(train=MathSourceConfig(source=train), actions_per_episode=1))
    assert held_out(mixed.task("eval", 0).question)


def test_presets_resolve_to_hub_datasets(monkeypatch):
    calls = []
    rows = {
        "dapo": [{"prompt": [{"role": "user", "content": PRESETS["dapo"].strip[0] + "\n\nFind 2+2.\n\n"
                              + PRESETS["dapo"].strip[1]}], "reward_model": {"ground_truth": "4"},
                  "data_source": "math_dapo"}] * 3,
        "olympiadbench": [{"id": 1, "question": "Compute $1/2+1/2$.", "final_answer": ["$1$"]}],
        "aime24": [{"ID": "2024-I-1", "Problem": "P", "Solution": "S", "Answer": 204}],
    }

    def fake_read(source, subset, split, where, key="source"):
        calls.append((source, subset, split))
        name = next(k for k, p in PRESETS.items() if p.source == source)
        return Dataset.from_list(rows[name])

    monkeypatch.setattr(math_data, "read_source", fake_read)
    assert math_data.load_tasks(MathSourceConfig(source="dapo"), "env.train") == [MathTask("Find 2+2.", "4")]
    assert math_data.load_tasks(MathSourceConfig(source="olympiadbench"), "env.eval") == [
        MathTask("Compute $1/2+1/2$.", "$1$")]
    assert math_data.load_tasks(MathSourceConfig(source="aime24"), "env.eval") == [MathTask("P", "204")]
    assert calls == [("BytedTsinghua-SIA/DAPO-Math-17k", "", "train"),
                     ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"), ("Maxwell-Jia/AIME_2024", "", "train")]
    assert {p.source for p in PRESETS.values()} >= {"POLARIS-Project/Polaris-Dataset-53K", "yentinglin/aime_2025"}
    assert answers_match("$1$", "1")


def test_hub_load_failure_is_a_config_error():
    # tests run with HF_DATASETS_OFFLINE=1, so nothing is downloaded
    with pytest.raises(ConfigError, match=r"env.train.source='no-such-user/no-such-dataset' could not be loaded"):
        math_data.load_tasks(MathSourceConfig(source="no-such-user/no-such-dataset"), "env.train")


def test_eval_source_warnings(tmp_path, caplog):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    with caplog.at_level(logging.WARNING):
        env = MathEnv(MathConfig(train=MathSourceConfig(source=path), eval=MathSourceConfig(source=path),
                                 eval_size=30))
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "evaluation tasks are training tasks" in messages
    assert "env.eval_size=30 exceeds the 20 rows" in messages
    assert env.datasets["eval"] is env.datasets["train"]  # read once


def test_proposals_in_the_kinds_keep_the_familys_shape():
    from marl_cli.envs.math_data import in_kinds

    env = make_env(kinds=["add_sub"], proposals="kinds")
    assert env.parse_task("12 - 4 = 8").answer == "8" and env.parse_task("7+9").question == "What is 7 + 9?"
    for outside in ("4 - 12", "8 * 6", "2 + 3 + 4", "(2 + 3)", "0 + 5"):  # negative, not +/-, 3 operands, (), 0
        assert env.parse_task(outside) is None, outside
    assert make_env(kinds=["add_sub"]).parse_task("4 - 12").answer == "-8"  # proposals=any: any expression
    assert in_kinds("8 * 6 / 3", ["arithmetic"], 20) and not in_kinds("8 / 4 / 2", ["arithmetic"], 20)
    assert not in_kinds("8 * 6 * 3 * 2", ["arithmetic"], 20) and not in_kinds("21 + 1", ["arithmetic"], 20)
    with pytest.raises(ConfigError, match="env.proposals=kinds: no kind of env.kinds=\\['word'\\] is a bare"):
        make_env(kinds=["word"], proposals="kinds")
