"""env=reasoning_gym against the library itself: every task is the library's own entry for its seed, and the reward is
the library's own ``score_answer`` on thousands of (prompt, answer) pairs of eight datasets, gold, wrong and
malformed; splits never share a question even where the generator repeats one; a mixture goes through the library's
composite; bad datasets and parameters are refused in one line; a tiny run trains and evaluates."""

import json
import random
import sys
import time

import pytest
import reasoning_gym
from omegaconf import OmegaConf
from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

from marl_cli.config.errors import ConfigError
from marl_cli.envs.math_data import held_out
from marl_cli.envs.reasoning_gym import ReasoningGymConfig, ReasoningGymEnv, check_reasoning_gym
from marl_cli.training.loop import train
from tests.helpers import FAST, cli, refusal, train_config

FAMILIES = {"basic_arithmetic": 40, "maze": 40, "mini_sudoku": 40, "shortest_path": 40, "word_sorting": 40, "gcd": 40,
            "sudoku": 16, "countdown": 16}
"""Datasets and the tasks of each checked (a quarter of them evaluation tasks); sudoku's and countdown's generators
take 65 and 95 ms a puzzle, and an evaluation task draws eight puzzles on average (one question in 8 is held out)."""


def env_of(dataset: str = "basic_arithmetic", seed: int = 0, **settings) -> ReasoningGymEnv:
    cfg = OmegaConf.merge(OmegaConf.structured(ReasoningGymConfig), {"dataset": dataset, **settings})
    return ReasoningGymEnv(cfg, seed=seed)


def perturbed(gold: str, rng: random.Random) -> list[str]:
    """Near misses of ``gold``: a character changed, dropped or added, the answer reversed, a digit moved by one."""
    i = rng.randrange(len(gold))
    digits = [j for j, ch in enumerate(gold) if ch.isdigit()]
    moved = gold
    if digits:
        j = rng.choice(digits)
        moved = gold[:j] + str((int(gold[j]) + 1) % 10) + gold[j + 1:]
    return [gold[:i] + rng.choice("abcxyz019 ") + gold[i + 1:], gold[:i] + gold[i + 1:], gold + "0", gold[::-1], moved]


def malformed(gold: str, rng: random.Random) -> list[str]:
    noise = "".join(rng.choice("0123456789 \n-+*/abcXYZ.,;:#") for _ in range(rng.randint(1, 60)))
    return ["", " ", "blah", "####", "I think the answer is " + gold, noise, "x" * 5000, gold * 40,
            "\n".join([gold] * 3)]


def candidates(gold: str, others: list[str], rng: random.Random) -> dict[str, list[str]]:
    return {"gold": [gold, gold + " ", gold + "\n"], "wrong": rng.sample(others, 3) + perturbed(gold, rng),
            "malformed": malformed(gold, rng)}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reward_is_the_librarys_own_score_on_gold_wrong_and_malformed_answers(family):
    env, rng, size = env_of(family), random.Random(family), FAMILIES[family]
    tasks = [env.task("train", i) for i in range(size - size // 4)] + [env.task("eval", i) for i in range(size // 4)]
    others = [task.entry["answer"] for task in tasks]
    counts = {"gold": 0, "wrong": 0, "malformed": 0}
    for task in tasks:
        library = reasoning_gym.create_dataset(family, seed=task.seed, size=1)  # the library, built on its own
        entry = library[0]
        assert (entry["question"], entry["answer"]) == (task.entry["question"], task.entry["answer"])
        state = env.initial_state(task)
        assert env.observe(state) == entry["question"].strip() and env.oracle(state) == entry["answer"].strip()
        for kind, answers in candidates(entry["answer"], others, rng).items():
            for answer in answers:
                expected = library.score_answer(answer, entry)
                step = env.step(state, answer)
                assert step.format_ok and step.reward == expected == env.score(step.state), (kind, answer[:80])
                assert step.success == (expected == 1.0) and step.done
                counts[kind] += 1
    assert counts == {"gold": 3 * size, "wrong": 8 * size, "malformed": 9 * size}  # 20 pairs a task, 5440 in all


def test_no_answer_is_a_format_failure_and_a_wrong_answer_leaves_another_try():
    env = env_of(actions_per_episode=2, format_penalty=-0.5)
    state = env.initial_state(env.task("train", 3))
    none = env.step(state, None)
    assert (none.reward, none.format_ok, none.success, none.done, none.info["library_score"]) == (-0.5, False, False,
                                                                                                  False, 0.0)
    assert reasoning_gym.create_dataset("basic_arithmetic", seed=state.task.seed, size=1).score_answer(
        None, state.task.entry) == 0.0  # the library's 0 for no answer; marl counts it as a format failure
    wrong = env.step(state, "not a number")
    assert (wrong.reward, wrong.format_ok, wrong.done) == (0.0, True, False)
    assert "'not a number' scored 0.00" in env.observe(wrong.state)
    assert env.step(wrong.state, "still wrong").done  # the last action ends the episode
    right = env.step(wrong.state, env.oracle(state))
    assert right.success and right.done and right.reward == 1.0 and env.score(right.state) == 1.0


def test_a_seed_the_librarys_generator_gives_up_on_moves_on_to_the_next():
    tiny = {"min_dist": 1, "max_dist": 4, "min_grid_size": 5, "max_grid_size": 6}
    with pytest.raises(RuntimeError, match="Could not find suitable path cell"):
        reasoning_gym.create_dataset("maze", seed=1893840538, size=1, **tiny)[0]
    task = env_of("maze", params=tiny).make_task(1893840538)
    assert task.seed != 1893840538 and task.entry == reasoning_gym.create_dataset("maze", seed=task.seed, size=1,
                                                                                    **tiny)[0]


def test_a_dataset_without_one_gold_answer_has_no_oracle():
    env = env_of("propositional_logic")  # any valid conclusion scores; its stored answer is not one the scorer takes
    states = [env.initial_state(env.task("train", i)) for i in range(5)]
    assert all(env.oracle(s) is None for s in states)


def test_tasks_are_the_same_for_a_seed_and_evaluation_ignores_the_run_seed():
    one, again, other = env_of(seed=1), env_of(seed=1), env_of(seed=2)
    assert [one.task("train", i) for i in range(20)] == [again.task("train", i) for i in range(20)]
    assert [one.task("train", i).question for i in range(20)] != [other.task("train", i).question for i in range(20)]
    assert [one.task("eval", i) for i in range(20)] == [other.task("eval", i) for i in range(20)]
    state = random.getstate()
    env_of(seed=7).task("train", 12345)
    assert random.getstate() == state  # the library's generation leaves Python's global generator as it was


def test_train_and_eval_never_share_a_question_even_where_the_generator_repeats():
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
             "allow_parentheses": False, "allow_negation": False}
    env = env_of(params=small)
    train_questions = [env.task("train", i).question for i in range(1500)]
    warm = [env.task("warmstart", i).question for i in range(300)]
    held = [env.task("eval", i).question for i in range(200)]
    assert len(set(train_questions)) < 300 and len(set(held)) < 200  # the generator repeats itself
    assert not any(held_out(q) for q in train_questions + warm) and all(held_out(q) for q in held)
    assert not set(held) & (set(train_questions) | set(warm))


def test_a_mixture_draws_each_dataset_by_weight_and_scores_it_with_the_librarys_composite():
    parts = [{"name": "basic_arithmetic", "weight": 3.0}, {"name": "gcd", "weight": 1.0,
                                                           "params": {"max_value": 50}}]
    env = env_of(datasets=parts)
    tasks = [env.task("train", i) for i in range(400)]
    share = sum(t.dataset == "basic_arithmetic" for t in tasks) / len(tasks)
    assert {t.dataset for t in tasks} == {"basic_arithmetic", "gcd"} and 0.65 < share < 0.85
    rng = random.Random(0)
    for task in tasks[:60]:
        composite = CompositeDataset(CompositeConfig(size=1, seed=task.seed, datasets=[
            DatasetSpec("basic_arithmetic", 3.0, {}), DatasetSpec("gcd", 1.0, {"max_value": 50})]))
        entry = composite[0]
        assert entry["question"] == task.question
        state = env.initial_state(task)
        for answer in [entry["answer"], rng.choice(tasks).entry["answer"], "", "x" * 300]:
            assert env.step(state, answer).reward == composite.score_answer(answer, entry)


def test_an_enum_parameter_is_written_as_its_value_or_name():
    """YAML cannot write the library's enum members: aiw's ``task_types: [siblings]`` (or ``FRIENDS``) reach its
    config as ``TaskType`` members, alone or in a mixture, and every task is the library's entry for its seed."""
    from reasoning_gym.logic.aiw import TaskType

    params = {"task_types": ["siblings", "FRIENDS"], "task_type_weights": [0.5, 0.5], "max_entities": 4}
    env = env_of("aiw", params=params)
    mixed = env_of(datasets=[{"name": "aiw", "params": params}, {"name": "gcd"}])
    library = {**params, "task_types": [TaskType.SIBLINGS, TaskType.FRIENDS]}
    kinds = set()
    for seed in range(40):
        task = env.task("train", seed)
        assert task.entry == reasoning_gym.create_dataset("aiw", seed=task.seed, size=1, **library)[0]
        kinds.add(task.entry["metadata"]["task_type"])
        mixed.task("train", seed)
    assert kinds == {"siblings", "friends"}


@pytest.mark.parametrize("overrides, message", [
    (["env.dataset=maz"], "env.dataset=maz: no such reasoning-gym dataset; similar: maze"),
    (["env.dataset=composite"], "env.dataset=composite: no such reasoning-gym dataset (a mixture is env.datasets)"),
    (["env.dataset=maze", "+env.params.min_distance=3"],
     "env.params.min_distance: reasoning-gym's maze has no such field; similar: min_dist"),
    (["env.dataset=maze", "+env.params.min_dist=0"],
     "env.params={'min_dist': 0}: reasoning-gym's maze refuses them (min_dist must be >= 1)"),
    (["env.dataset=mini_sudoku", "+env.params.max_empty=20"], "reasoning-gym's mini_sudoku refuses them"),
    (["env.dataset=maze", "+env.params.seed=3"], "env.params.seed: marl sets it"),
    (["env.dataset=maze", "+env.params.min_dist=30", "+env.params.max_dist=40", "+env.params.max_grid_size=5"],
     "reasoning-gym's maze could not generate a task from seed"),
    (["env.dataset=count_bits", "+env.params.min_n=5", "+env.params.max_n=5"],
     "reasoning-gym's count_bits gave no evaluation-side question in 256 draws"),
    (["env.datasets=[{name:maze},{name:gdc}]"],
     "env.datasets[1].name=gdc: no such reasoning-gym dataset; similar: gcd"),
    (["env.datasets=[{name:maze},{name:gcd,params:{foo:1}}]"], "env.datasets[1].params.foo: reasoning-gym's gcd has"),
    (["env.datasets=[{name:maze,weight:0}]"], "env.datasets[0].weight must be positive"),
    (["env.dataset=aiw", "+env.params.task_types=[sibling]", "+env.params.task_type_weights=[1.0]"],
     "reasoning-gym's aiw refuses them ('sibling' is not a TaskType; choose from siblings, friends, colleagues)"),
])
def test_bad_datasets_and_parameters_fail_in_one_line(overrides, message):
    assert message in refusal(["env=reasoning_gym", "workflow=single_agent", *overrides])


def test_without_the_package_the_check_names_the_extra(monkeypatch):
    cfg = train_config("~experiment", "env=reasoning_gym", "workflow=single_agent")
    start = time.perf_counter()
    check_reasoning_gym(cfg)
    assert time.perf_counter() - start < 3.0
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import reasoning_gym` meets when not installed
    with pytest.raises(ConfigError) as refused:
        check_reasoning_gym(cfg)
    assert str(refused.value) == "env=reasoning_gym needs reasoning-gym: pip install 'marl[reasoning_gym]'"


SETUP = [*(o for o in FAST if o != "env.size=4"), "env=reasoning_gym"]  # env.size: a key of grid envs only


def test_a_reasoning_gym_run_trains_and_evaluates_and_marl_eval_loads_it(tmp_path):
    summary = train(train_config(*SETUP, "workflow=single_agent", "trainer.steps=1", "trainer.warmstart.enabled=true",
                                 "trainer.warmstart.num_examples=16"), tmp_path / "run")
    assert summary["status"] == "completed" and 0.0 <= summary["eval/success"] <= 1.0
    evaluated = cli("eval", *SETUP, "workflow=single_agent", f"load={tmp_path / 'run'}",
                    f"hydra.run.dir={tmp_path / 'eval'}")
    assert evaluated.returncode == 0, evaluated.stderr
    rows = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    result = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert sorted(r["task"] for r in rows) == list(range(int(result["eval/tasks"])))  # every task's answer, to read
    assert sum(r["success"] for r in rows) / len(rows) == result["eval/success"]


def test_a_team_of_two_trains_on_reasoning_gym(tmp_path):
    team = ["workflow=cory", "algorithm=at_grpo", "algorithm.mode=independent", "policy=per_role"]
    summary = train(train_config(*SETUP, *team, "trainer.steps=1", "env.eval_size=2"), tmp_path)
    assert summary["status"] == "completed" and summary["policies"] == {"pioneer": ["pioneer"],
                                                                        "observer": ["observer"]}
