"""One run per run directory (``cli.run_dirs``): a second run in a dir that holds another run stops in one line before
any work and leaves the first run's files as they were; time-stamped dirs started in the same second stay apart."""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import OmegaConf

from marl_cli.cli.run_dirs import claim, other_run
from tests.helpers import FAST, cli


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its path, with its SHA-256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_run_in_a_run_dir_is_refused_and_the_first_run_is_untouched(tmp_path):
    run = tmp_path / "D"
    first = cli("train", *FAST, "seed=0", "trainer.steps=2", "trainer.save_every=2", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run / "checkpoints" / "step_000002").is_dir()
    before = fingerprint(run)
    second = cli("train", *FAST, "seed=5", "trainer.steps=2", "trainer.save_every=2", f"hydra.run.dir={run}")
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f"marl train: error: hydra.run.dir={run} holds another run (metrics.jsonl, samples.jsonl, checkpoints, a "
        f"different config in .hydra/); continue that run with trainer.resume={run}, or give another hydra.run.dir "
        "to start afresh")
    assert second.stdout == ""  # stopped before the run started: not even its run dir line
    assert fingerprint(run) == before
    evaluated = cli("eval", *FAST, f"load={run}", f"hydra.run.dir={run}")  # an eval is another run too
    assert evaluated.returncode == 2 and "holds another run" in evaluated.stderr
    assert fingerprint(run) == before


def test_a_fixed_dir_without_another_run_is_used(tmp_path):
    config = OmegaConf.create({"trainer": {"resume": None}, "seed": 0})
    assert other_run(tmp_path, config) == ""  # empty
    (tmp_path / "notes.txt").write_text("mine")
    assert other_run(tmp_path, config) == ""  # files that are no run's
    (tmp_path / "checkpoints").mkdir()
    assert "holds another run (checkpoints)" in other_run(tmp_path, config)
    resumed = OmegaConf.create({"trainer": {"resume": str(tmp_path)}, "seed": 0})
    assert other_run(tmp_path, resumed) == ""  # a resume continues in its own dir


def test_time_stamped_dirs_started_in_the_same_second_stay_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dirs = []
    for _ in range(3):
        config = OmegaConf.create({"hydra": {"run": {"dir": "outputs/x/${now:%Y-%m-%d}_12-00-00"},
                                             "job": {"name": "train"}}})
        claim("hydra.run.dir", config, lambda where: "never asked")
        dirs.append(config.hydra.run.dir)
    stamp = dirs[0].rsplit("/", 1)[1]
    assert dirs == [f"outputs/x/{stamp}", f"outputs/x/{stamp}_2", f"outputs/x/{stamp}_3"]
    assert all((tmp_path / d).is_dir() for d in dirs)


def test_a_sweep_into_a_sweep_dir_that_holds_another_sweep_is_refused(tmp_path):
    sweep = tmp_path / "S"
    (sweep / "steps=1" / "seed=0").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}")
    out = cli("train", "-m", *FAST, "trainer.steps=1,2", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 2
    assert out.stderr.strip() == (f"marl train: error: hydra.sweep.dir={sweep} holds another sweep (multirun.yaml, "
                                  "steps=1/); give another hydra.sweep.dir")
    assert sorted(p.name for p in sweep.rglob("*")) == ["multirun.yaml", "seed=0", "steps=1"]
