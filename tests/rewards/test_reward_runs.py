"""Rewards from models in a run: ``marl train`` with a judge, and every bad reward config refused in one line
before a model is built."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAST, cli, refusal, step_records
from tests.rewards.stub_judge import StubJudge

JUDGED = [*FAST, "trainer.steps=2", "trainer.warmstart.enabled=false", "reward.roles=[agent]",
          "trainer.log_completions_every=1"]


def test_marl_train_with_an_http_judge_trains_on_its_scores(tmp_path):
    with StubJudge(lambda prompt: "Score: 6") as stub:
        done = cli("train", *JUDGED, "reward=http", f"reward.url={stub.url}", "reward.program_weight=0.5",
                   f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    steps = step_records(tmp_path)
    assert len(steps) == 2 and len(stub.requests) == sum(s["judge/calls"] for s in steps) > 0
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    trained = [s for s in samples if s["split"] == "train"]
    assert trained and all(s["judge_score"] == 0.6
                           and s["reward"] == pytest.approx(0.6 + 0.5 * s["program_reward"]) for s in trained)
    for step in steps:
        assert step["judge/errors"] == step["judge/parse_failures"] == 0
        assert step["judge/score"] == pytest.approx(0.6) and "judge/agreement" in step and step["time/judge_s"] > 0


def test_marl_train_with_a_frozen_judge_model_counts_its_unparsable_replies(tmp_path):
    done = cli("train", *JUDGED, "reward=judge", "reward.invalid=-1", "reward.model.tiny.num_hidden_layers=1",
               "reward.model.tiny.hidden_size=32", "reward.model.tiny.intermediate_size=64",
               "reward.model.tiny.num_attention_heads=2", "reward.model.tiny.num_key_value_heads=1",
               "reward.model.tiny.head_dim=16", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    step = step_records(tmp_path)[0]
    assert step["judge/calls"] > 0 and step["judge/parse_failures"] == step["judge/calls"]  # a random judge
    assert step["train/reward"] == -1 and (tmp_path / "tiny_init_judge" / "config.json").is_file()


@pytest.mark.parametrize(("overrides", "message"), [
    (["reward=judge", "reward.verdict='Score:'"],
     "reward.verdict='Score:' needs exactly one {score} slot (where the judge writes its number) and no other "
     "field, e.g. 'Score: {score}'"),
    (["reward=judge", "reward.template='Rate it. {verdict}'"],
     "reward.template shows the judge nothing to judge: it needs {completion}, {answer} or {prompt}"),
    (["reward=judge", "reward.roles=[]"],
     "reward=judge scores no role: name them, e.g. reward.roles=[agent] (workflow=single_agent has agent)"),
    (["reward=judge", "reward.roles=[solver]"],
     "reward.roles names solver, which workflow=single_agent does not have (its roles: agent)"),
    (["reward=judge", "+reward.templates.judge='{answer} {verdict}'"],
     "reward.templates has a rubric for 'judge', which workflow=single_agent does not have (its roles: agent)"),
    (["reward=judge", "reward.policy=main"],
     "reward.policy='main' is not a policy of this run; its policies: shared (or leave it null to judge with "
     "reward.model, frozen)"),
    (["reward=judge", "reward.model.name_or_path=/no/such/judge"],
     "reward.model.name_or_path=/no/such/judge: no model there (no config.json)"),
    (["reward=http", "reward.url=localhost:8000"], "reward.url='localhost:8000' is not an http(s) URL"),
    (["reward=judge", "reward.weight=0"],
     "reward.weight and reward.program_weight are both 0: every judged row's reward would be 0"),
])
def test_a_bad_reward_config_is_refused_in_one_line(overrides, message):
    roles = [] if any(o.startswith("reward.roles") for o in overrides) else ["reward.roles=[agent]"]
    assert refusal([*FAST, *roles, *overrides]) == message


def test_the_cli_refuses_a_bad_reward_config_with_exit_2_and_no_run_dir(tmp_path):
    done = cli("train", *FAST, "reward=judge", "reward.roles=[planner]", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2 and not (tmp_path / "run").exists()
    assert done.stderr.strip().splitlines()[-1].endswith(
        "reward.roles names planner, which workflow=single_agent does not have (its roles: agent)")


def test_marl_train_with_a_pairwise_http_judge_logs_its_position_bias(tmp_path):
    def prefer_first(prompt: str) -> str:
        return "Better: 1"  # a judge that always picks the reply shown first

    with StubJudge(prefer_first) as stub:
        done = cli("train", *JUDGED, "reward=http", f"reward.url={stub.url}", "reward.pairwise=true",
                   f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "Answer 1:" in stub.requests[0]["messages"][0]["content"]
    for step in step_records(tmp_path):
        if step["judge/calls"]:
            assert step["judge/first_position_rate"] == 1.0 and step["judge/swap_consistency"] == 0.0


@pytest.mark.parametrize(("overrides", "message"), [
    (["reward.pair_template='Pick: {answer_a} {verdict}'"],
     "reward.pair_template never shows the judge reply b: it needs {answer_b} or {completion_b}"),
    (["reward.pair_verdict='Better'"],
     "reward.pair_verdict='Better' needs exactly one {score} slot (where the judge writes its number) and no other "
     "field, e.g. 'Score: {score}'"),
])
def test_a_bad_pairwise_rubric_is_refused(overrides, message):
    assert refusal([*FAST, "reward.roles=[agent]", "reward=judge", "reward.pairwise=true", *overrides]) == message
