"""A value-based algorithm is two files: a module (its schema with a setting of its own, its estimator, what it needs
from its critic and its own critic update, ``ALGORITHMS.register``) and its YAML. Here a throwaway REINFORCE with a
learned state-value baseline, A = r − w·V(s), is written into a temporary dir and loaded like a user's: it composes,
trains, resumes, and a wrong key fails in one line, with no file of marl changed."""

from __future__ import annotations

import pytest

from marl_cli.algorithms import ALGORITHMS
from marl_cli.training.loop import train
from tests.helpers import FAST, install_plugin, metric_records, refusal, train_config

MODULE = "marl_baseline_plugin"
PLUGIN = '''
"""REINFORCE with a learned state-value baseline: A = r − w·V(s); the critic regresses V(s) to r."""

from dataclasses import dataclass

from marl_cli.algorithms.base import ALGORITHMS, Algorithm
from marl_cli.algorithms.values import CriticBatch, Regression, ValueLearning, annotate_states, prompt_only
from marl_cli.config.schema import AlgorithmConfig, bounded


@dataclass
class BaselineConfig(AlgorithmConfig):
    """REINFORCE with a baseline."""

    name: str = "baseline"
    weight: float = bounded(1.0, ge=0.0, le=1.0)  # w: how much of the learned value is subtracted


def estimator(rows, cfg, rng, rollouts=None):
    for s in rows:
        s.advantage = s.reward - cfg.weight * s.estimates["value"]
    return rows, {"value_mean": sum(s.estimates["value"] for s in rows) / max(len(rows), 1)}


def regress(critic, replay, rows, cfg, step, rng):
    import torch

    targets = torch.tensor([s.reward for s in rows], dtype=torch.float64)
    return critic.update(CriticBatch([prompt_only(s) for s in rows], [Regression("state", targets)]), rng)


VALUES = ValueLearning("utterance", annotate_states, regress, settings=("epochs", "value_clip"))
ALGORITHMS.register("baseline", schema=BaselineConfig)(Algorithm(estimator, values=VALUES))
'''
YAMLS = {"algorithm/baseline.yaml": "defaults:\n  - base_baseline\n  - _self_\n\nname: baseline\nweight: 0.5\n"}
CHOSEN = [*FAST, "algorithm=baseline", "critic=utterance", "critic.learning_rate=1e-3", "trainer.save_every=1",
          "trainer.eval_every=0"]


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    return install_plugin(monkeypatch, tmp_path, MODULE, PLUGIN, YAMLS, [ALGORITHMS])


def _config(conf: str, *overrides: str):
    return train_config(*CHOSEN, *overrides, f"hydra.searchpath=[file://{conf}]")


def test_it_composes_trains_and_resumes(plugin, tmp_path):
    cfg = _config(plugin, "trainer.steps=1")
    assert cfg.algorithm.weight == 0.5 and set(cfg.algorithm) == {"name", "mode", "num_generations", "weight"}
    run = tmp_path / "run"
    assert train(cfg, run)["status"] == "completed"
    resumed = train(_config(plugin, "trainer.steps=2", f"trainer.resume={run}"), run)
    assert resumed["status"] == "completed" and resumed["steps"] == 2
    records = metric_records(run)
    assert [r["step"] for r in records if "critic/shared/value_loss" in r] == [1, 2]
    assert all("train/value_mean" in r for r in records if "critic/shared/value_loss" in r)


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.weight=2", "algorithm.weight=2.0: must be >= 0.0 and <= 1.0"),
    ("algorithm.wieght=1", "algorithm.wieght: no such key; valid keys: name, mode, num_generations, weight"),
    ("algorithm.filter=zero_std", "algorithm.filter is a setting of algorithm=at_grpo, algorithm=grpo, "
                                  "algorithm=m_grpo, not of algorithm=baseline"),
    ("critic.tau=0.5", "critic.tau=0.5 is not used by algorithm=baseline"),
    ("critic=token", "algorithm=baseline learns a utterance-level value model: use critic=utterance"),
])
def test_a_wrong_key_fails_in_one_line(plugin, override, message):
    assert refusal([*CHOSEN, override], [plugin]).startswith(message)
