"""SIGINT/SIGTERM during a step: the step finishes, its checkpoint holds only completed steps, and a resume
ends where the uninterrupted run ends (same metrics, each step once, same weights)."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from marl_cli.training.learner import policy_trainer
from marl_cli.training.loop import train
from tests.helpers import FAST, train_config

RUN = [*FAST, "trainer.steps=3", "trainer.mini_batch_size=2", "trainer.save_every=0", "trainer.eval_every=0"]
TIMING = ("time/",)


def _signal_on_optimiser_steps(monkeypatch, signum: int, calls: set[int]) -> None:
    """Send ``signum`` to this process on the given optimiser steps (counted from 1; 3 per RL step here)."""
    clip = torch.nn.utils.clip_grad_norm_
    count = 0

    def clip_and_signal(*args, **kwargs):
        nonlocal count
        count += 1
        if count in calls:
            os.kill(os.getpid(), signum)
        return clip(*args, **kwargs)

    monkeypatch.setattr(policy_trainer.torch.nn.utils, "clip_grad_norm_", clip_and_signal)


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step:06d}" / "policies" / "shared" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("whole") / "run"
    assert train(train_config(*RUN), run)["status"] == "completed"
    return run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_update_finishes_the_step_and_the_resume_matches(tmp_path, monkeypatch, uninterrupted, signum):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _signal_on_optimiser_steps(patch, signum, {5})  # step 2, between its mini-batches 2 and 3
        with pytest.raises(KeyboardInterrupt):
            train(train_config(*RUN), run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert train(train_config(*RUN, f"trainer.resume={run}"), tmp_path / "unused")["status"] == "completed"
    assert [m["step"] for m in _metrics(run)] == [m["step"] for m in _metrics(uninterrupted)]  # each step once
    for mine, whole in zip(_metrics(run), _metrics(uninterrupted), strict=True):
        assert mine == pytest.approx(whole, rel=1e-5, abs=1e-7)
    for key, value in _weights(uninterrupted, 3).items():
        torch.testing.assert_close(_weights(run, 3)[key], value, rtol=1e-5, atol=1e-7)


def test_a_second_signal_stops_at_once_and_saves_nothing_of_the_step(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _signal_on_optimiser_steps(monkeypatch, signal.SIGINT, {4, 5})  # twice during step 2
    with pytest.raises(KeyboardInterrupt):
        train(train_config(*RUN, "trainer.save_every=1"), run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert "interrupted during step 2: not saved" in (run / "train.log").read_text()


def test_the_same_seed_twice_gives_the_same_metrics(tmp_path, uninterrupted):
    again = tmp_path / "again"
    train(train_config(*RUN), again)
    assert _metrics(again) == _metrics(uninterrupted)  # exactly, on CPU
    for key, value in _weights(uninterrupted, 3).items():
        assert torch.equal(_weights(again, 3)[key], value)


def test_a_run_killed_after_logging_a_step_but_before_its_checkpoint_resumes_each_step_once(tmp_path, uninterrupted):
    """What SIGKILL leaves between a step's metrics line and its checkpoint: the resume trains that step again
    and keeps one line per step; it ends with the uninterrupted run's metrics and weights."""
    run = tmp_path / "run"
    train(train_config(*RUN, "trainer.save_every=1"), run)
    shutil.rmtree(run / "checkpoints" / "step_000003")  # killed after step 3's line, before its checkpoint
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # ... and before the final eval
    train(train_config(*RUN, f"trainer.resume={run}"), tmp_path / "unused")
    assert [m["step"] for m in _metrics(run)] == [m["step"] for m in _metrics(uninterrupted)]
    for mine, whole in zip(_metrics(run), _metrics(uninterrupted), strict=True):
        assert mine == pytest.approx(whole, rel=1e-5, abs=1e-7)
    for key, value in _weights(uninterrupted, 3).items():
        torch.testing.assert_close(_weights(run, 3)[key], value, rtol=1e-5, atol=1e-7)
