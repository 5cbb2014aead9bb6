"""Sweeps: seed repeats in job dirs named by their overrides, Optuna search, the SLURM launcher config."""

import json

import pytest
import yaml
from hydra import compose, initialize_config_dir

from marl_cli.cli.app import key_of
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import job_dir
from marl_cli.plugins import register_configs
from tests.helpers import FAST, cli

register_configs()
QUICK = [o for o in FAST if not o.startswith("trainer.learning_rate=")] + ["trainer.steps=1", "env.eval_size=3"]
"""FAST without a fixed learning rate (a command-line value would pin the parameter Optuna searches)."""
UNNAMED = ("hydra.job.config.override_dirname.exclude_keys=[seed,hparams_search,"
           + ",".join(key_of(o) for o in QUICK) + "]")
"""Leaves the fixed test settings out of job dir names, so they show only what the sweep varies."""


def test_job_dir_names_jobs_by_their_overrides_without_the_seed():
    assert job_dir("", 3) == "defaults/seed=3"
    assert job_dir("experiment=toy/table/sudoku_grpo,trainer.steps=5", 1) == (
        "experiment=toy_table_sudoku_grpo,trainer.steps=5/seed=1")
    long_a, long_b = job_dir("x=" + "a" * 300, 0), job_dir("x=" + "a" * 299 + "b", 0)
    assert len(long_a.split("/")[0]) == 120 and long_a != long_b


def test_seed_repeats_share_one_overrides_dir(tmp_path):
    out = cli("train", "-m", *QUICK, UNNAMED, "rollout.temperature=0.9", "seed=1,2",
               f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    assert [r.name for r in runs] == ["seed=1", "seed=2"]
    assert runs[0].parent == runs[1].parent and runs[0].parent.name == "rollout.temperature=0.9"
    assert all(json.loads((r / "summary.json").read_text())["status"] == "completed" for r in runs)


def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = cli("train", "-m", *QUICK, UNNAMED, "env=sudoku", "env.holes=99,4", f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 2
    failed = "env.holes=99,env=sudoku/seed=0: env.holes must be in [1, 12]"
    assert f"1 job(s) of the sweep failed (the others ran): {failed}" in out.stderr
    status = {p.parent.parent.name: json.loads(p.read_text())["status"] for p in tmp_path.rglob("summary.json")}
    assert status == {"env.holes=99,env=sudoku": "failed", "env.holes=4,env=sudoku": "completed"}


def test_optuna_search_over_the_learning_rate_reports_the_best_trial(tmp_path):
    out = cli("train", *QUICK, UNNAMED, "hparams_search=lr", "hydra.sweeper.n_trials=2",
               f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    assert len(runs) == 2
    results = {}
    for run in runs:
        lr = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["trainer"]["learning_rate"]
        assert 1e-5 <= lr <= 1e-3 and run.parent.name == f"trainer.learning_rate={lr}"
        results[lr] = json.loads((run / "summary.json").read_text())["eval/success"]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(results.values())
    assert results[best["best_params"]["trainer.learning_rate"]] == best["best_value"]


def test_slurm_launcher_config_composes_onto_the_submitit_plugin():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1
    assert launcher.submitit_folder == f"{cfg.hydra.sweep.dir}/.submitit/%j"


def test_cpu_launcher_runs_jobs_side_by_side_with_their_thread_count(tmp_path):
    """hydra/launcher=cpu (joblib): two jobs at once, each with `threads=1`; every job completes its run."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    out = cli("train", "-m", "hydra/launcher=cpu", "threads=1", *FAST, "trainer.steps=1", "seed=0,1",
               f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.rglob("summary.json"))
    assert len(summaries) == 2
    assert all(json.loads(p.read_text())["status"] == "completed" for p in summaries)
    assert "Joblib" in out.stdout + out.stderr
