"""Checkpoints carry a manifest (size and SHA-256 of each file); a resume skips damaged ones with a warning;
``trainer.save_total_limit`` keeps the newest."""

import json
import logging

import pytest
import torch

from marl_cli.config.errors import ConfigError
from marl_cli.config.validate import check_overrides
from marl_cli.provenance import git_sha, version
from marl_cli.training.checkpoint import MANIFEST, checkpoint_dir, damage, latest_checkpoint, prune_checkpoints
from marl_cli.training.loop import train
from tests.helpers import FAST, train_config

RUN = [*FAST, "trainer.steps=2", "trainer.save_every=1", "trainer.eval_every=0"]


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    assert train(train_config(*RUN), run)["status"] == "completed"
    return run


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_every_file_of_a_checkpoint_is_in_its_manifest(run):
    checkpoint = run / "checkpoints" / "step_000002"
    listed = json.loads((checkpoint / MANIFEST).read_text())
    assert {"state.pt", "policies/shared/model.safetensors", "policies/shared/config.json"} <= set(listed)
    assert damage(checkpoint) is None


@pytest.mark.parametrize("damaged", ["policies/shared/model.safetensors", "state.pt"])
def test_a_truncated_file_falls_back_to_the_previous_checkpoint(run, caplog, damaged):
    _truncate(run / "checkpoints" / "step_000002" / damaged)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(run).name == "step_000001"
    assert f"checkpoint step_000002 is damaged ({damaged} differs from its manifest" in caplog.text
    summary = train(train_config(*RUN, "trainer.steps=3", f"trainer.resume={run}"), run)
    assert summary["status"] == "completed"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[steps.index(1):] == [1, 2, 3, 3]  # each step once: step 2 trained again, then 3 and the final eval


def test_no_intact_checkpoint_is_one_line(run):
    for checkpoint in (run / "checkpoints").iterdir():
        (checkpoint / "state.pt").unlink()
    with pytest.raises(ConfigError, match="every checkpoint under checkpoints/ is damaged"):
        latest_checkpoint(run)


def test_the_summary_names_the_marl_version_and_commit(run):
    summary = json.loads((run / "summary.json").read_text())
    assert summary["marl_version"] == version()
    assert summary["git_sha"] == git_sha()


def _checkpoints(run):
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_save_total_limit_keeps_the_newest_and_a_resume_continues(tmp_path):
    run = tmp_path / "run"
    assert train(train_config(*RUN, "trainer.steps=3", "trainer.save_total_limit=2"), run)["status"] == "completed"
    assert _checkpoints(run) == ["step_000002", "step_000003"]
    summary = train(train_config(*RUN, "trainer.steps=4", "trainer.save_total_limit=2", f"trainer.resume={run}"), run)
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert _checkpoints(run) == ["step_000003", "step_000004"]


def test_pruning_never_removes_the_saved_checkpoint_nor_newer_ones(tmp_path):
    for step in (1, 2, 3, 5):
        (checkpoint_dir(tmp_path, step) / "policies").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000004.tmp").mkdir()
    saved = checkpoint_dir(tmp_path, 3)  # a resume skipped a damaged step 5 and saved step 3 again
    assert prune_checkpoints(tmp_path, saved, None) == []
    assert [p.name for p in prune_checkpoints(tmp_path, saved, 1)] == ["step_000001", "step_000002"]
    assert _checkpoints(tmp_path) == ["step_000003", "step_000004.tmp", "step_000005"]


def test_save_total_limit_below_one_is_refused():
    with pytest.raises(ConfigError, match="trainer.save_total_limit=0: must be >= 1"):
        check_overrides("train", ["trainer.save_total_limit=0"])


def test_a_checkpoint_pickled_before_the_row_type_moved_loads(tmp_path, monkeypatch):
    """``state.pt`` of a run saved when ``Sample`` lived in ``marl_cli.rollout.samples`` (rows in flight, replay
    buffers) loads with today's class."""
    import sys
    import types

    from marl_cli.core.samples import Sample
    from marl_cli.training.checkpoint import load_state

    old = types.ModuleType("marl_cli.rollout.samples")
    old.Sample = Sample
    monkeypatch.setitem(sys.modules, "marl_cli.rollout.samples", old)
    monkeypatch.setattr(Sample, "__module__", "marl_cli.rollout.samples")
    torch.save({"in_flight": [Sample(3, 0, 0, "solver", "shared", [1, 2], [3], 1.0)]}, tmp_path / "state.pt")
    monkeypatch.undo()
    assert b"marl_cli.rollout.samples" in (tmp_path / "state.pt").read_bytes()
    row = load_state(tmp_path)["in_flight"][0]
    assert type(row) is Sample and (row.task, row.reward) == (3, 1.0)
