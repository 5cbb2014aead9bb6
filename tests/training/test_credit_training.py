"""Credit methods and turn returns in whole runs (in-process, tiny model): what reaches the update and the logs."""

import json

from marl_cli.training.loop import train
from tests.helpers import FAST, train_config


def _records(run, name):
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def test_hicra_trains_on_token_advantages_and_logs_its_coverage(tmp_path):
    run = tmp_path / "r"
    summary = train(train_config(*FAST, "credit=hicra", "credit.detector=before_answer", "trainer.steps=1",
                                 "trainer.log_completions_every=1", "algorithm.num_generations=4",
                                 "rollout.temperature=1.5"), run)
    assert summary["status"] == "completed"
    step = next(r for r in _records(run, "metrics.jsonl") if "train/reward" in r)
    assert 0.0 <= step["credit/hicra_marked_fraction"] <= 1.0 and "time/credit_s" in step
    assert "train/shared/advantage/token_mean" in step
    rows = [r for r in _records(run, "samples.jsonl") if r["split"] == "train"]
    assert rows and all(len(r["token_advantages"]) > 0 for r in rows)


def test_turn_returns_train_a_multi_turn_run(tmp_path):
    run = tmp_path / "r"
    summary = train(train_config(*FAST, "workflow.max_turns=2", "algorithm.turn_credit=return", "algorithm.gamma=0.9",
                                 "algorithm.norm_group=episode", "trainer.steps=1"), run)
    assert summary["status"] == "completed"
    step = next(r for r in _records(run, "metrics.jsonl") if "train/reward" in r)
    assert "train/return_mean" in step and "credit/hicra_marked_fraction" not in step
