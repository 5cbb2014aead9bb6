"""End-to-end training: metrics, summary, checkpoints and resume in this process; multirun and the W&B
logger through ``marl train`` itself."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.training.loop import train
from tests.helpers import FAST, cli, train_config

register_configs()


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run") / "r"
    train(train_config(*FAST, "trainer.steps=2", "trainer.save_every=1", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=16", "trainer.warmstart.batch_size=8"), run)
    return run


def test_summary(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["steps"] == 2
    for prefix in ("eval_pre_warmstart", "eval_before", "eval"):
        assert 0.0 <= summary[f"{prefix}/success"] <= 1.0
        assert summary[f"{prefix}/tasks"] == 6
    assert summary["policies"] == {"shared": ["agent"]}


def test_metrics_jsonl(run_dir):
    records = _records(run_dir)
    train = [r for r in records if "train/success" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["train/shared/rows"] == 6  # 2 tasks x 3 generations
        assert r["train/generate_calls"] == 1  # one batched call for all tasks and branches
        assert r["train/shared/learning_rate"] == pytest.approx(1e-3)
        assert r["train/shared/grad_norm"] >= 0
        assert -3 < r["train/agent/reward"] < 10
    assert any("warmstart/shared/loss" in r for r in records)
    assert [r["step"] for r in records if "eval/success" in r] == [2]


def test_checkpoints(run_dir):
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["step_000001", "step_000002"]
    last = run_dir / "checkpoints" / "step_000002"
    assert (last / "policies" / "shared" / "config.json").exists()
    assert (last / "policies" / "shared" / "tokenizer.json").exists()
    assert (last / "state.pt").exists()
    weights = load_file(last / "policies" / "shared" / "model.safetensors")
    assert weights["model.embed_tokens.weight"].shape[1] == 32


def test_resume_continues_from_last_checkpoint(run_dir, tmp_path):
    train(train_config(*FAST, "trainer.steps=3", "trainer.save_every=1", f"trainer.resume={run_dir}"),
          tmp_path / "resumed")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert "eval_before/success" in summary  # kept from the first invocation
    train_steps = [r["step"] for r in _records(run_dir) if "train/success" in r]
    assert train_steps == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_000003" / "state.pt").exists()


def test_resume_and_eval_take_the_runs_own_config(tmp_path, monkeypatch):
    run = tmp_path / "run"
    first = cli("train", *FAST, "trainer.steps=1", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.splitlines()[0] == f"run dir: {run}"  # the first line a run prints
    monkeypatch.chdir(tmp_path)  # where a new run dir would go (outputs/...)
    resumed = cli("train", "trainer.resume=run", "trainer.steps=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # FAST's env size and tiny model, not the defaults
    assert resumed.stdout.splitlines()[0] == "run dir: run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # continued in its own dir: no stray run dir
    assert "resuming" in (run / "train.log").read_text() and "trainer.steps=2" in (run / ".hydra" / "overrides.yaml"
                                                                                    ).read_text()
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    evaluated = cli("eval", f"load={run}", f"hydra.run.dir={tmp_path / 'ev'}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["eval/tasks"] == 6  # FAST's env.eval_size
    changed = cli("train", f"trainer.resume={run}", "trainer.steps=3", "env.size=5", "seed=3", "trainer.sharding=fsdp2",
                  f"hydra.run.dir={tmp_path / 'r3'}")
    assert changed.returncode == 2
    assert ("the run was trained with other settings; changed: env.size (4 -> 5), seed (0 -> 3), "
            "trainer.sharding ('none' -> 'fsdp2')") in changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1


def test_resume_without_checkpoint_fails_cleanly(tmp_path):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*FAST, f"trainer.resume={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^trainer.resume=.*: the run has no checkpoint under checkpoints/$"):
        train(cfg, tmp_path / "x")


def test_multirun_writes_one_run_per_value(tmp_path):
    sweep = tmp_path / "sweep"
    out = cli("train", "-m", *FAST, "trainer.steps=1,2", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.rglob("summary.json"))
    assert len({s.parent.parent for s in summaries}) == 2 and all(s.parent.name == "seed=0" for s in summaries)
    assert sorted(json.loads(s.read_text())["steps"] for s in summaries) == [1, 2]


def test_wandb_logger_writes_offline_run(tmp_path):
    run = tmp_path / "wb"
    out = cli("train", *FAST, "logger=wandb", "logger.mode=offline", "trainer.steps=1", f"hydra.run.dir={run}")
    assert out.returncode == 0, out.stderr[-3000:]
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_importance_sampling_correction_runs_end_to_end(tmp_path):
    train(train_config(*FAST, "trainer.steps=1", "trainer.is_correction=sequence_truncate"), tmp_path / "r")
    step = next(r for r in _records(tmp_path / "r") if "train/reward" in r)
    assert step["train/shared/is_ratio/max"] <= 3.0  # the sampler is the learner here: weights ≈ 1
    assert step["train/shared/is_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
