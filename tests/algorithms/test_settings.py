"""Settings per algorithm: each algorithm composes the keys its schema declares and refuses, in one line naming the
algorithms that read it, a key only another algorithm reads; a run saved with the one flat schema of every algorithm
(before the split) still resumes."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from marl_cli.algorithms import ALGORITHMS
from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides, check_resume
from marl_cli.training.loop import train
from tests.helpers import FAST, train_config

CRITIC = {"ppo": "token", "marft": "utterance", "archer": "utterance"}
FLAT = {"mode": "independent", "selection": "greedy", "num_generations": 3, "norm_by_std": True, "std_eps": 1e-6,
        "filter": "none", "turn_credit": "immediate", "gamma": 1.0, "norm_group": "turn", "align_d": 8,
        "aligned_roles": ["sub"]}
"""Every key of the flat ``AlgorithmConfig`` every algorithm composed before the split, at its default."""


def keys(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(ALGORITHMS.schemas[name])}


def picks(name: str) -> list[str]:
    return ["~experiment", f"algorithm={name}", f"critic={CRITIC.get(name, 'none')}",
            *(["workflow=solo_research"] if name == "m_grpo" else [])]


@pytest.mark.parametrize("name", ["grpo", "at_grpo", "m_grpo", "ppo", "marft", "archer"])
def test_an_algorithm_composes_its_own_keys_only(name):
    cfg = train_config(*picks(name))
    assert set(cfg.algorithm) == keys(name)
    assert {"name", "mode", "num_generations"} <= keys(name)


def _foreign() -> list[tuple[str, str, list[str]]]:
    """(algorithm, a key it lacks, the algorithms that read the key), for every such pair."""
    names = ALGORITHMS.names()
    return [(name, key, sorted(other for other in names if key in keys(other)))
            for name in names for key in sorted(set().union(*map(keys, names)) - keys(name))]


@pytest.mark.parametrize(("name", "key", "readers"), _foreign())
def test_a_key_only_another_algorithm_reads_is_refused_naming_them(name, key, readers):
    value = getattr(ALGORITHMS.schemas[readers[0]](), key)
    value = f"[{','.join(value)}]" if isinstance(value, list) else str(value).lower()
    with pytest.raises(ConfigError) as refused:
        check_overrides("train", [*picks(name), f"algorithm.{key}={value}"])
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"algorithm.{key} is a setting of ")
    assert all(f"algorithm={reader}" in message for reader in readers) and f"not of algorithm={name}" in message


def test_the_gamma_of_each_algorithm_documents_its_own_discount():
    from marl_cli.config.reference import _comments

    meanings = {name: next(text for cls in ALGORITHMS.schemas[name].__mro__ if (text := _comments(cls).get("gamma")))
                for name in ("grpo", "ppo", "marft", "archer")}
    assert "per turn" in meanings["grpo"] and "per completion token" in meanings["ppo"]
    assert "acting order" in meanings["marft"] and "TD step" in meanings["archer"]


def test_a_run_saved_with_the_flat_schema_resumes(tmp_path):
    """A PPO run whose saved config carries the GRPO keys every algorithm composed before the split: the resume
    checks its settings against them as unchanged and trains on."""
    run = tmp_path / "run"
    overrides = [*FAST, "algorithm=ppo", "critic=token", "trainer.save_every=1", "trainer.eval_every=0"]
    assert train(train_config(*overrides, "trainer.steps=1"), run)["status"] == "completed"
    saved = OmegaConf.load(run / ".hydra" / "config.yaml") if (run / ".hydra").exists() else None
    config = OmegaConf.to_container(train_config(*overrides, "trainer.steps=1"), resolve=False)
    config["algorithm"] = {**FLAT, **config["algorithm"]}
    (run / ".hydra").mkdir(exist_ok=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    assert saved is None or "filter" not in saved.algorithm
    resumed = train_config(*overrides, "trainer.steps=2", f"trainer.resume={run}")
    check_resume(resumed, run)
    assert train(resumed, run)["steps"] == 2
    with pytest.raises(ConfigError, match=r"changed: algorithm.lam \(0.95 -> 0.5\)"):
        check_resume(train_config(*overrides, "algorithm.lam=0.5"), run)
