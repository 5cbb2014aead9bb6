"""Learned reward models: the pieces by hand (pairs, episodes, outcomes, correlation), then ``marl train`` with a
scalar reward model and with SPA's progress estimator, saved and loaded by another run; bad input refused."""

from __future__ import annotations

import json

import pytest
import torch

from marl_cli.core.samples import Sample
from marl_cli.rewards.learned import (
    FILE,
    distance_correlation,
    outcome,
    pearson,
    preference_pairs,
    role_episodes,
    tensor_shapes,
)
from tests.helpers import FAST, cli, refusal, step_records


def row(task: int, branch: int, turn: int, success: bool = False, reward: float = 0.0, role: str = "agent",
        **info: float) -> Sample:
    return Sample(task, branch, turn, role, "shared", [1], [2], reward, success=success, info=dict(info))


def test_preference_pairs_are_the_better_and_worse_replies_of_one_group():
    rows = [row(0, 0, 0), row(0, 1, 0), row(0, 2, 0), row(1, 0, 0), row(0, 0, 1)]
    labels = [1.0, 0.0, 1.0, 0.0, 0.0]
    # task 0 turn 0: 0 and 2 beat 1; task 1 and task 0's turn 1 are groups of one
    assert preference_pairs(rows, labels) == [(0, 1), (2, 1)]


def test_role_episodes_are_in_turn_order_and_outcomes_read_them():
    rows = [row(0, 0, 1, success=True, reward=1.0), row(0, 0, 0, reward=-0.1), row(0, 1, 0, reward=-1.0),
            row(0, 0, 0, role="tool")]
    episodes = role_episodes(rows)
    assert [[(r.branch, r.turn, r.role) for r in e] for e in episodes] == [[(0, 0, "agent"), (0, 1, "agent")],
                                                                          [(0, 0, "tool")], [(1, 0, "agent")]]
    assert [outcome(e, "success") for e in episodes] == [1.0, 0.0, 0.0]
    assert outcome(episodes[0], "return") == pytest.approx(0.9)


def test_pearson_by_hand():
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, 3.0], [1.0, 0.0, 1.0]) == pytest.approx(0.0)
    assert pearson([1.0, 1.0], [0.0, 1.0]) is None


def test_distance_correlation_reads_the_remaining_progress_after_each_step():
    episodes = [[row(0, 0, 0, distance=4.0), row(0, 0, 1, distance=0.0)], [row(0, 1, 0, distance=2.0)]]
    # remaining 1 − Σc: 0.8 then 0.0; 0.5 — distances 4, 0, 2: perfectly ordered, r = 0.9820 by hand
    stats = distance_correlation(episodes, [[0.2, 0.8], [0.5]])
    xs, ys = [0.8, 0.0, 0.5], [4.0, 0.0, 2.0]
    assert stats["progress/distance_corr"] == pytest.approx(pearson(xs, ys)) and 0.98 < pearson(xs, ys) < 0.99
    assert distance_correlation([[row(0, 0, 0)]], [[0.1]]) == {}


LEARNED = [*FAST, "trainer.steps=2", "trainer.warmstart.enabled=false", "reward.roles=[agent]",
           "trainer.save_every=2", "reward.learning_rate=1e-3"]


def test_spa_progress_pays_contribution_plus_validity_and_learns(tmp_path):
    done = cli("train", *LEARNED, "reward=progress", "workflow.max_turns=3", "trainer.log_completions_every=1",
               f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    steps = step_records(tmp_path)
    for step in steps:
        assert step["progress/loss"] < step["progress/loss_before"]  # a step's fit lowers its own episodes' loss
        assert "progress/distance_corr" in step and "progress/contribution" in step
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    trained = [s for s in samples if s["split"] == "train"]
    assert trained and all(s["reward"] == pytest.approx(s["judge_score"] + 0.5 * s["format_ok"]) for s in trained)
    saved, = (tmp_path / "checkpoints").glob(f"step_*/{FILE}")
    assert tensor_shapes(saved)["head.weight"] == [1, 32]


def test_a_saved_scalar_model_loads_frozen_into_another_run_and_a_wrong_shape_is_refused(tmp_path):
    first = cli("train", *LEARNED, "reward=scalar", "reward.objective=bradley_terry", f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr
    assert all("judge/agreement" in s for s in step_records(tmp_path / "a"))
    second = cli("train", *LEARNED, "reward=scalar", f"reward.path={tmp_path / 'a'}", "reward.train=false",
                 f"hydra.run.dir={tmp_path / 'b'}")
    assert second.returncode == 0, second.stderr
    assert all("reward_model/loss" not in s for s in step_records(tmp_path / "b"))  # frozen
    wider = refusal([*LEARNED, "reward=scalar", f"reward.path={tmp_path / 'a'}", "+reward.model.tiny.hidden_size=64"])
    assert wider == (f"reward.path={tmp_path / 'a'}: its head is 1×32 but the reward model here is 1×64 (a scalar "
                     "head on a model of width 64: reward.model, or the policy's model); train it with the same model")


@pytest.mark.parametrize(("overrides", "message"), [
    (["reward=scalar", "reward.path=/no/such/run"],
     f"reward.path=/no/such/run: no saved reward model there ({FILE} in it, a checkpoint or a run)"),
    (["reward=progress", "algorithm=at_grpo", "algorithm.mode=tree"],
     "reward=progress splits each episode's outcome over its steps; tree rollouts have no episode per row: use "
     "algorithm.mode=independent"),
    (["reward=progress", "reward.warmup_steps=4", "trainer.steps=4"],
     "reward.warmup_steps=4: the policies would never train in trainer.steps=4"),
    (["reward=scalar", "reward.warmup_steps=1", "reward.train=false"],
     "reward.warmup_steps=1: a frozen reward model (reward.train=false) does not learn; set warmup_steps=0"),
    (["reward=scalar", "+reward.model.lr=3"],
     "reward.model.lr: not a key this can change; valid keys: name_or_path, tiny, dtype"),
])
def test_a_bad_learned_reward_config_is_refused_in_one_line(overrides, message):
    assert refusal([*FAST, "reward.roles=[agent]", *overrides]) == message


def test_a_reward_model_warm_up_holds_the_policies(tmp_path):
    from marl_cli.training.loop import train
    from tests.helpers import train_config

    train(train_config(*LEARNED, "reward=progress", "workflow.max_turns=2", "reward.warmup_steps=1"), tmp_path)
    steps = step_records(tmp_path)
    assert [s["train/shared/active"] for s in steps] == [0.0, 1.0]  # step 1: the estimator learns, the policy waits
    assert "train/shared/loss" not in steps[0] and "train/shared/loss" in steps[1]
    assert all(s["progress/loss"] < s["progress/loss_before"] for s in steps)


def _step_metrics(run, step: int) -> dict:
    record = next(r for r in step_records(run) if r["step"] == step)
    return {k: v for k, v in record.items() if not k.startswith("time/")}


@pytest.mark.parametrize("kind", ["progress", "scalar"])
def test_a_resumed_run_with_a_learned_reward_model_equals_the_uninterrupted_one(tmp_path, kind):
    from marl_cli.training.checkpoint import load_state
    from marl_cli.training.loop import train
    from tests.helpers import train_config

    run = [*FAST, "trainer.warmstart.enabled=false", "reward.roles=[agent]", f"reward={kind}", "trainer.save_every=1",
           "reward.learning_rate=1e-3", "workflow.max_turns=2", "trainer.deterministic=true"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(train_config(*run, "trainer.steps=3"), whole)
    train(train_config(*run, "trainer.steps=2"), cut)
    assert train(train_config(*run, "trainer.steps=3", f"trainer.resume={cut}"), cut)["status"] == "completed"
    assert _step_metrics(whole, 3) == _step_metrics(cut, 3)
    a, b = (load_state(r / "checkpoints" / "step_000003")["reward"] for r in (whole, cut))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]) and a["rng"] == b["rng"]
