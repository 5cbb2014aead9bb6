"""Checkpoints carry a manifest (size and SHA-256 of each file); a resume skips damaged ones with a warning."""

import json
import logging

import pytest

from marl_cli.config.errors import ConfigError
from marl_cli.provenance import git_sha, version
from marl_cli.training.checkpoint import MANIFEST, damage, latest_checkpoint
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
