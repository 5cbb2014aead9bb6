"""``trainer.deterministic=true``: the environment set before torch loads (and the re-execution that makes it
hold), torch's switches, and two runs of one seed giving the same bits."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from marl_cli import determinism
from marl_cli.training.loop import train
from tests.helpers import FAST, SMALL, marl, torch_threads, train_config

RUN = [*FAST, *SMALL, "trainer.steps=4", "trainer.mini_batch_size=2", "trainer.eval_every=2",
       "trainer.deterministic=true",
       "trainer.warmstart.enabled=true", "trainer.warmstart.num_examples=400", "trainer.warmstart.batch_size=16",
       "trainer.warmstart.epochs=3", "trainer.warmstart.learning_rate=3e-3", "rollout.temperature=1.0"]
"""A few steps that train (the warm start gives answers that parse, so rewards differ within groups)."""
TIMING = ("time/",)
"""Wall-clock fields of metrics.jsonl: the only ones two identical runs may differ in (with a warm-start cache,
also whether the warm start came from it)."""


@pytest.fixture
def torch_switches():
    """Restore the process-wide settings the mode changes (the rest of the suite runs without it)."""
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.backends.mkldnn.deterministic, torch.get_float32_matmul_precision())
    yield
    threads, algorithms, mkldnn, precision = saved
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(algorithms)
    torch.backends.mkldnn.deterministic = mkldnn
    torch.set_float32_matmul_precision(precision)


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING) and not k.endswith("/cached")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    final = sorted((run / "checkpoints").iterdir())[-1]
    return load_file(final / "policies" / "shared" / "model.safetensors")


def test_the_override_is_read_from_the_command_line():
    assert determinism.requested(["experiment=embedded", "trainer.deterministic=true"])
    assert determinism.requested(["++trainer.deterministic=True"])
    assert determinism.requested(["-m", "trainer.deterministic=false,true"])  # a sweep with a job in the mode
    assert not determinism.requested(["trainer.deterministic=false", "deterministic=true"])
    assert not determinism.requested([])


def test_the_environment_is_set_then_the_command_line_runs_again(monkeypatch):
    calls = []
    for name in determinism.deterministic_env(1):
        monkeypatch.setenv(name, "unset")  # monkeypatch restores each afterwards
    monkeypatch.delenv(determinism.MARKER)
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "marl", "train", "threads=3", "trainer.deterministic=1"])
    determinism.prepare(["threads=3", "trainer.deterministic=1"])
    assert calls == [(sys.executable, [sys.executable, "marl", "train", "threads=3", "trainer.deterministic=1"])]
    assert os.environ["MKL_CBWR"] == "AUTO" and os.environ["PYTHONHASHSEED"] == "0"
    assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == os.environ[determinism.MARKER] == "3"
    determinism.prepare(["trainer.deterministic=true"])  # started in the mode: runs on
    determinism.prepare(["trainer.deterministic=false"])
    assert len(calls) == 1


def test_two_runs_in_the_mode_give_the_same_bits(tmp_path, torch_switches, caplog):
    """In one process (the environment is the suite's; the subprocess test below has the full mode): torch's
    switches are set, the same metrics (wall-clock fields aside) and weights, bit for bit."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:  # the second run takes the first's warm start from the cache: the RL steps are compared
        assert train(train_config(*RUN, f"trainer.warmstart.cache={tmp_path / 'cache'}"), run)["status"] == "completed"
    assert torch.are_deterministic_algorithms_enabled() and torch.get_float32_matmul_precision() == "highest"
    assert "did not start with its environment" in caplog.text  # set in-process: said, not silently partial
    assert any(m.get("train/shared/grad_norm", 0) > 0 for m in _metrics(runs[0]))  # the steps trained
    assert _metrics(runs[0]) == _metrics(runs[1])
    first, second = (_weights(run) for run in runs)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_two_marl_train_runs_in_the_mode_give_the_same_bits(tmp_path):
    """``marl train`` as a user runs it, twice: the process re-executes into the mode's environment (no warning
    that it did not), and the runs' metrics and weights are the same bits."""
    runs = []
    for name in ("a", "b"):
        done = marl("train", *RUN, "trainer.steps=30", "threads=2",
                    f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "did not start with its environment" not in (tmp_path / name / "train.log").read_text()
        runs.append(tmp_path / name)
    assert _metrics(runs[0]) == _metrics(runs[1])
    first, second = (_weights(run) for run in runs)
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_two_team_runs_on_two_threads_give_the_same_bits_without_the_mode(tmp_path):
    """A ``tool_plan`` team sharing one model (long prompts: its shared prompt pass has a gradient torch would add
    atomically across threads; the two roles' rows interleave in the batch) with MARFT's team critic, on two threads
    outside the mode: two runs give the same metrics, weights and optimiser states."""
    from marl_cli.training.checkpoint import load_state

    runs = [tmp_path / "a", tmp_path / "b"]
    with torch_threads(2):
        for run in runs:
            cfg = train_config(*FAST, "workflow=tool_plan", "workflow.max_turns=2", "algorithm=marft",
                               "critic=utterance", "critic.scope=team", "trainer.steps=2", "trainer.save_every=2",
                               "trainer.eval_every=0", "rollout.temperature=1.5")
            assert train(cfg, run)["status"] == "completed"
    assert _metrics(runs[0]) == _metrics(runs[1])
    first, second = (load_state(run / "checkpoints" / "step_000002") for run in runs)
    a, b = (_weights(run) for run in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    for key, state in first["trainers"]["shared"]["optimizer"]["state"].items():
        other = second["trainers"]["shared"]["optimizer"]["state"][key]
        assert all(torch.equal(state[k], other[k]) for k in state if torch.is_tensor(state[k]))
