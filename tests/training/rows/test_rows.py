"""Where a step's rows come from, on their own: rollouts, a decoupled main trainer's rollouts that meet the
store, and the sub trainer's rows read from it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from marl_cli.config.schema import StoreConfig
from marl_cli.core.staleness import Staleness
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import Sampling
from marl_cli.store import build_store
from marl_cli.training.build import Run, build_team
from marl_cli.training.rows.decoupled import Exchange
from marl_cli.training.rows.sources import MainRows, RolloutRows, StoreRows, row_source
from tests.helpers import FAST, ScriptedGenerator, train_config

TASKS_PER_STEP = 2
K = 3


class FakePolicy:
    """A policy as the exchange handles it: saved to a dir and loaded back (what was loaded is recorded)."""

    def __init__(self, name: str):
        self.name = name
        self.loaded: list[str] = []

    def save(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "weights").write_text(self.name)

    def load_weights(self, path: Path) -> None:
        self.loaded.append(path.name)


def _run(tmp_path: Path, *overrides: str) -> Run:
    cfg = train_config(*FAST, f"rollout.tasks_per_step={TASKS_PER_STEP}", f"algorithm.num_generations={K}", *overrides)
    workflow = build_team(cfg)
    role_map = {role: role for role in workflow.roles}
    policies = {role: FakePolicy(role) for role in workflow.roles}
    rollout = Rollout(workflow, policies, dict(role_map), ScriptedGenerator(lambda *a: "#### R R D D"), Sampling(1.0))
    return Run(cfg, tmp_path, role_map, rollout, staleness=Staleness(cfg.trainer.max_staleness))


def _exchange(tmp_path: Path, role: str, max_staleness: int = 0) -> Exchange:
    cfg = OmegaConf.create({"trainer": {"role": role, "max_staleness": max_staleness},
                            "store": {"namespace": "t", "poll_s": 0.01, "timeout_s": 5.0}})
    store = build_store(StoreConfig(name="sqlite", path=str(tmp_path / "store.sqlite"), namespace="t"))
    return Exchange(store, cfg, tmp_path / role, ["agent"], "agent")


def test_rollout_rows_play_the_steps_tasks_k_times(tmp_path):
    run = _run(tmp_path)
    source = row_source(run)
    assert type(source) is RolloutRows and source.plays and source.save_every == 0
    samples, rollouts, metrics = source.rows(2, random.Random(0))
    assert rollouts is None and len(samples) == TASKS_PER_STEP * K
    assert run.generator.started == [["agent"]]  # the backend started the acting policies first
    tasks = [run.workflow.env.task("train", i) for i in (2, 3)]  # step 2's tasks follow step 1's
    prompts = {tuple(ord(c) for c in run.workflow.prompt("agent", run.workflow.initial_state(t))) for t in tasks}
    assert {tuple(s.prompt_ids) for s in samples} == prompts
    assert metrics["train/generate_calls"] == 1.0 and "train/agent/reward" in metrics
    assert source.report({"store/trajectories": 4.0}) == {} and source.why_empty(metrics) == ""


def test_main_rows_load_the_sub_weights_and_hand_the_sub_trajectories_to_the_store(tmp_path):
    run = _run(tmp_path)
    main = row_source(run, _exchange(tmp_path, "main"))
    assert type(main) is MainRows and main.plays
    main.start(run.policies)  # publishes the starting weights as version 0
    _, _, metrics = main.rows(1, random.Random(0))
    assert run.policies["agent"].loaded == ["v000000"]  # synchronous: version 0 loaded before step 1's rollout
    assert metrics["store/sub_weights_version"] == 0.0 and metrics["store/written"] == TASKS_PER_STEP * K
    assert main.report({"store/trajectories": 6.0}) == {"store/trajectories": 6.0}
    main.close()


def test_store_rows_read_the_step_rescore_publish_and_acknowledge_once_saved(tmp_path):
    run = _run(tmp_path)
    main = MainRows(run, _exchange(tmp_path, "main"))
    main.start(run.policies)
    written, _, _ = main.rows(1, random.Random(0))
    sub = row_source(run, _exchange(tmp_path, "sub"))
    assert type(sub) is StoreRows and not sub.plays and sub.save_every == 1
    samples, rollouts, metrics = sub.rows(1, random.Random(0))
    assert sorted((s.task, s.branch) for s in samples) == sorted((s.task, s.branch) for s in written)
    assert rollouts == {t: list(range(K)) for t in range(TASKS_PER_STEP)} and metrics["store/read"] == len(written)
    sub.after_update(1)  # publishes version 1 ...
    assert main.before_rollout(2)["store/sub_weights_version"] == 1.0  # ... which the main trainer loads
    assert len(sub.rows(1, random.Random(0))[0]) == len(written)  # unacknowledged: read again
    sub.saved(1)
    assert sub.acked == 1 and sub.rows(1, random.Random(0))[0] == []
    assert "sub-trajectories" in sub.why_empty({"store/read": 0.0})
    sub.close()
    main.close()


def test_a_resumed_sub_trainer_acknowledges_what_its_checkpoint_holds(tmp_path):
    run = _run(tmp_path)
    main = MainRows(run, _exchange(tmp_path, "main"))
    main.start(run.policies)
    main.rows(1, random.Random(0))
    sub = StoreRows(run, _exchange(tmp_path, "sub"))
    sub.restored(1)  # resumed after step 1: a crash may have left its items unacknowledged
    assert sub.acked == 1 and sub.rows(1, random.Random(0))[0] == []
    with pytest.raises(TimeoutError):  # nothing of step 2 is stored yet: the wait times out
        sub.exchange.timeout_s = 0.05
        sub.rows(2, random.Random(0))


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_main_rolls_out_with_sub_weights_at_most_max_staleness_updates_old(tmp_path, max_staleness):
    """Step 3 is due from sub weights of step 2 − k: with k = 1 version 1 will do, with k = 0 main waits (here: in
    vain); the sub rows record the version they were sampled from."""
    run = _run(tmp_path, f"trainer.max_staleness={max_staleness}")
    main = MainRows(run, _exchange(tmp_path, "main", max_staleness))
    main.start(run.policies)
    main.exchange.store.set("weights", {"version": 1, "path": str(tmp_path / "main" / "published" / "v000000")})
    main.exchange.timeout_s = 0.05
    if max_staleness == 0:
        with pytest.raises(TimeoutError, match="the sub trainer's weights of step 2 or newer"):
            main.rows(3, random.Random(0))
    else:
        samples, _, metrics = main.rows(3, random.Random(0))
        assert metrics["store/sub_weights_version"] == 1.0 and metrics["store/lag_steps"] == 1.0
        assert {s.policy_version for s in samples} == {1}
    main.close()
