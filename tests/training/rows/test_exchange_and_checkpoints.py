"""The decoupled trainers' exchange and checkpoints, without a training loop."""

from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ModelConfig, StoreConfig
from marl_cli.core.samples import Sample
from marl_cli.policies.regime import build_policies
from marl_cli.store import build_store
from marl_cli.training.checkpoint import RunState, latest_checkpoint, load_state, save_checkpoint
from marl_cli.training.rows.decoupled import KEEP_VERSIONS, Exchange
from tests.policies.test_tiny import SMALL


def _exchange(tmp_path, role: str, store_path) -> Exchange:
    cfg = OmegaConf.create({"trainer": {"role": role, "max_staleness": 0},
                            "store": {"namespace": "t", "poll_s": 0.01, "timeout_s": 5.0}})
    store = build_store(StoreConfig(name="sqlite", path=str(store_path), namespace="t"))
    return Exchange(store, cfg, tmp_path / role, ["sub"], "sub")


def _rows() -> list[Sample]:
    """Two rollouts of task 0: rollout 0 calls the sub-agent twice (segments 0, 1), rollout 1 once."""
    rows = [Sample(task=0, branch=b, turn=0, role="main", policy="main", prompt_ids=[1], completion_ids=[2],
                   reward=1.0) for b in (0, 1)]
    for branch, segment in ((0, 0), (0, 1), (1, 0)):
        rows += [Sample(task=0, branch=branch, turn=t, role="sub", policy="sub", prompt_ids=[3], completion_ids=[4],
                        reward=0.5, segment=segment) for t in (0, 1)]
    return rows


def _policies(tmp_path, seed: int):
    model = OmegaConf.structured(ModelConfig(tiny=SMALL))
    return build_policies({"main": "main", "sub": "sub"}, model, seed, tmp_path / f"p{seed}", torch.device("cpu"),
                          regime="per_role")


def test_main_writes_each_step_once_and_sub_reads_it_until_acknowledged(tmp_path):
    main, sub = (_exchange(tmp_path, role, tmp_path / "store.sqlite") for role in ("main", "sub"))
    assert main.send(1, _rows()) == {"store/written": 3.0}  # one item per sub-trajectory
    assert main.send(1, _rows()) == {"store/written": 3.0}  # a restarted main does not write it twice
    rows, rollouts, metrics = sub.receive(1)
    assert sorted((r.branch, r.segment, r.turn) for r in rows) == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                                                                     (1, 0, 0), (1, 0, 1)]
    assert {r.role for r in rows} == {"sub"} and rollouts == {0: [0, 1]} and metrics["store/read"] == 3.0
    assert len(sub.receive(1)[0]) == 6  # unacknowledged items are read again (a sub trainer that crashed)
    sub.acknowledge(range(1, 2))
    assert sub.receive(1)[0] == []


def test_published_weights_reach_the_other_trainer_and_old_versions_are_pruned(tmp_path):
    main, sub = (_exchange(tmp_path, role, tmp_path / "store.sqlite") for role in ("main", "sub"))
    mine, theirs = _policies(tmp_path, 0), _policies(tmp_path, 1)
    main.start(mine)
    sub.start(theirs)
    for a, b in zip(mine["sub"].model.parameters(), theirs["sub"].model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="already holds a run"):
        _exchange(tmp_path, "main", tmp_path / "store.sqlite").start(mine)
    for version in range(1, KEEP_VERSIONS + 3):
        sub.publish(version, theirs)
    assert len(list((tmp_path / "sub" / "published").glob("v*"))) == KEEP_VERSIONS
    assert main.refresh(mine, KEEP_VERSIONS + 3) == {"store/sub_weights_version": KEEP_VERSIONS + 2.0,
                                                     "store/lag_steps": 0.0}  # step s played from update s - 1


def test_the_newest_complete_checkpoint_is_resumed_with_its_rng(tmp_path):
    policies = {"shared": _policies(tmp_path, 0)["main"]}
    rng = random.Random(3)
    first = RunState(1)
    first.add("trainers", {"shared": {"k": 1}})
    first.add("extra", {"store/trajectories": 4.0})
    save_checkpoint(tmp_path, first, policies, rng)
    expected = rng.random()
    second = RunState(2)
    second.add("trainers", {"shared": {"k": 2}})
    save_checkpoint(tmp_path, second, policies, rng)
    with pytest.raises(ValueError, match="'trainers' is already there"):
        second.add("trainers", {})
    with pytest.raises(ValueError, match="'torch_rng' is already there"):
        second.add("torch_rng", None)
    (tmp_path / "checkpoints" / "step_000003.tmp").mkdir()  # a crash mid-write
    (tmp_path / "checkpoints" / "step_000004").mkdir()  # no state.pt: never completed
    assert latest_checkpoint(tmp_path).name == "step_000002"
    state = load_state(tmp_path / "checkpoints" / "step_000001")
    assert state["step"] == 1 and state["trainers"] == {"shared": {"k": 1}} and state["extra"] == {
        "store/trajectories": 4.0}
    restored = random.Random()
    restored.setstate(state["python_rng"])
    assert restored.random() == expected
    assert (tmp_path / "checkpoints" / "step_000001" / "policies" / "shared" / "config.json").exists()
    with pytest.raises(ConfigError, match="the run has no checkpoint"):
        latest_checkpoint(tmp_path / "checkpoints" / "step_000004")
