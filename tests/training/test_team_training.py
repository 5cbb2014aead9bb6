"""Heterogeneous teams trained end to end (in this process): two policies of different architectures, learning
rates and role temperatures, every row scored at its own temperature, an exact resume; a policy waiting for its
turn under ``trainer.alternate_every`` keeps its weights and optimiser state bit for bit."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from marl_cli.training.loop import train
from tests.helpers import FAST, step_records, train_config

# Two agents that both answer move lists (CORY's pioneer and observer), warm-started enough to answer in the format
# now and then, so rewards differ within groups and every policy takes gradient steps.
TEAM = [*FAST, "workflow=cory", "algorithm=at_grpo", "algorithm.mode=independent", "policy=per_role",
        "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=48", "trainer.warmstart.epochs=4",
        "trainer.warmstart.learning_rate=5e-3", "trainer.warmstart.batch_size=8", "trainer.warmstart.shared_base=false"]
HETERO = [*TEAM, "+policy.models.pioneer.tiny.num_hidden_layers=2", "+policy.models.pioneer.tiny.hidden_size=48",
          "+policy.models.pioneer.tiny.head_dim=8", "+policy.trainers.pioneer.learning_rate=3e-3",
          "+rollout.roles.pioneer.temperature=1.0", "+rollout.roles.observer.temperature=0.6"]
ROLES = ("pioneer", "observer")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One warm-start cache for the module: the runs of a test start from the same warm-started models."""
    return f"trainer.warmstart.cache={tmp_path_factory.mktemp('warmstart')}"


def _weights(checkpoint: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "policies" / name / "model.safetensors")


def test_a_team_of_different_models_trains_resumes_exactly_and_scores_each_role_at_its_temperature(tmp_path, cache):
    run = tmp_path / "whole"
    train(train_config(*HETERO, cache, "trainer.steps=2"), run)
    last = run / "checkpoints" / "step_000002"
    configs = {n: json.loads((last / "policies" / n / "config.json").read_text()) for n in ROLES}
    assert (configs["pioneer"]["num_hidden_layers"], configs["pioneer"]["hidden_size"]) == (2, 48)
    assert (configs["observer"]["num_hidden_layers"], configs["observer"]["hidden_size"]) == (1, 32)
    steps = step_records(run)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # each policy's rows are scored at the temperature its role sampled at (1.0 and 0.6)
        assert r["train/pioneer/learning_rate"] == 3e-3 and r["train/observer/learning_rate"] == 1e-3
        assert r["train/pioneer/logprob_gap/max"] <= 1e-3 and r["train/observer/logprob_gap/max"] <= 1e-3
    assert all(any(r.get(f"train/{n}/trained_row_fraction", 0) > 0 for r in steps) for n in ROLES)
    part = tmp_path / "part"
    train(train_config(*HETERO, cache, "trainer.steps=1", "trainer.save_every=1"), part)
    train(train_config(*HETERO, cache, "trainer.steps=2", f"trainer.resume={part}"), tmp_path / "unused")
    for name in ROLES:
        resumed = _weights(part / "checkpoints" / "step_000002", name)
        assert all(torch.equal(resumed[k], v) for k, v in _weights(last, name).items())
    assert [r["train/reward"] for r in step_records(part)] == [r["train/reward"] for r in steps]


def test_one_shared_model_scores_each_role_at_its_own_temperature(tmp_path, cache):
    run = tmp_path / "r"
    train(train_config(*TEAM, cache, "policy=shared", "trainer.steps=1", "trainer.beta=0.01",
                       "+rollout.roles.pioneer.temperature=1.0", "+rollout.roles.observer.temperature=0.5"), run)
    step = step_records(run)[0]
    assert step["train/shared/logprob_gap/max"] <= 1e-3  # one model, two temperatures: 0.1+ nats if scored at one
    assert step["train/shared/mini_batches"] >= 2  # a mini-batch holds one temperature


def test_a_policy_waiting_for_its_turn_keeps_its_weights_and_optimiser_state(tmp_path, cache):
    run = tmp_path / "r"
    train(train_config(*TEAM, cache, "trainer.steps=3", "trainer.save_every=1", "trainer.alternate_every=1"), run)
    active = [(r["train/pioneer/active"], r["train/observer/active"]) for r in step_records(run)]
    assert active == [(1.0, 0.0), (0.0, 1.0), (1.0, 0.0)]
    checkpoints = {s: run / "checkpoints" / f"step_{s:06d}" for s in range(1, 4)}
    states = {s: torch.load(c / "state.pt", weights_only=False)["trainers"] for s, c in checkpoints.items()}
    for waiting, (first, second) in (("pioneer", (1, 2)), ("observer", (2, 3))):
        assert states[first][waiting]["optimizer"]["state"]  # it has trained: Adam's moments are there to keep
        before, after = _weights(checkpoints[first], waiting), _weights(checkpoints[second], waiting)
        assert all(torch.equal(before[k], after[k]) for k in before)
        old, new = states[first][waiting], states[second][waiting]
        assert old["scheduler"] == new["scheduler"]
        assert old["optimizer"]["param_groups"] == new["optimizer"]["param_groups"]
        for key, slot in old["optimizer"]["state"].items():
            assert all(torch.equal(v, new["optimizer"]["state"][key][n]) for n, v in slot.items())
    assert not states[1]["observer"]["optimizer"]["state"]  # not its turn yet
    assert states[3]["pioneer"]["scheduler"]["last_epoch"] == 2  # its steps 1 and 3
    assert states[3]["observer"]["scheduler"]["last_epoch"] == 1  # its step 2
