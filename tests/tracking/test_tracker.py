import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.tracking.tracker import Tracker, wandb_identity, wandb_mode, write_json


def test_metrics_jsonl_appends_one_object_per_log(tmp_path):
    tracker = Tracker(tmp_path, OmegaConf.create({"name": "none"}), {}, "run")
    tracker.log(1, {"train/reward": 0.5})
    tracker.log(2, {"train/reward": 0.75, "eval/success": 1})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "train/reward": 0.5}, {"step": 2, "train/reward": 0.75, "eval/success": 1}]


def test_unknown_logger_and_mode(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="logger.name"):
        Tracker(tmp_path, OmegaConf.create({"name": "tensorboard"}), {}, "run")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert wandb_mode("auto") == "online"
    assert wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode("auto") == "offline"
    with pytest.raises(ConfigError, match="logger.mode"):
        wandb_mode("sometimes")


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"status": "running"})
    write_json(path, {"status": "completed"})
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert not list(tmp_path.glob("*.tmp"))


def test_secrets_never_reach_the_wandb_config():
    from marl_cli.tracking.tracker import redacted

    config = {"env": {"web": {"api_key": "sk-123", "url": "u"}}, "store": {"password": "pw", "port": 1},
              "list": [{"token": "t"}], "empty": {"password": ""}}
    assert redacted(config) == {"env": {"web": {"api_key": "***", "url": "u"}}, "store": {"password": "***", "port": 1},
                                "list": [{"token": "***"}], "empty": {"password": ""}}


def test_wandb_names_a_sweep_job_by_its_overrides_and_groups_its_seeds(tmp_path):
    logger = OmegaConf.create({"name": "wandb", "tags": ["paper"], "run_name": None, "group": None})
    job = tmp_path / "multirun" / "toy" / "2026-11-23_10-00-00" / "trainer.learning_rate=0.0001" / "seed=2"
    assert wandb_identity(job, "toy", logger, "train") == {
        "name": "toy/trainer.learning_rate=0.0001/seed=2", "group": "toy/trainer.learning_rate=0.0001",
        "job_type": "train", "tags": ["paper", "toy"]}
    single = wandb_identity(tmp_path / "outputs" / "toy" / "2026-11-23_10-00-00", "toy", logger, "eval")
    assert (single["name"], single["group"], single["job_type"]) == ("toy/2026-11-23_10-00-00", "toy", "eval")
    chosen = OmegaConf.create({"name": "wandb", "tags": [], "run_name": "mine", "group": "g"})
    assert wandb_identity(job, "toy", chosen, "train")["name"] == "mine"
    assert wandb_identity(job, "toy", chosen, "train")["group"] == "g"


def test_an_offline_wandb_run_says_where_it_is_and_how_to_upload_it(tmp_path, monkeypatch, caplog):
    import wandb

    files = tmp_path / "wandb" / "offline-run-x" / "files"
    monkeypatch.setattr(wandb, "init", lambda **kwargs: SimpleNamespace(dir=str(files), mode=kwargs["mode"]))
    logger = OmegaConf.create({"name": "wandb", "project": "p", "entity": None, "mode": "offline", "tags": []})
    with caplog.at_level("INFO", logger="marl_cli.tracking"):
        Tracker(tmp_path, logger, {"name": "toy"}, "train")
    offline = tmp_path / "wandb" / "offline-run-x"
    assert caplog.messages == [f"W&B: offline run in {offline}; upload it with: wandb sync {offline}"]


def test_a_wandb_table_takes_every_records_columns(tmp_path, monkeypatch):
    """Rows of one role carry what another's lack (a judge's score on the solver's rows only): the W&B table has
    every column, empty where a row has none (a table of the first record's columns raised KeyError)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = OmegaConf.create({"name": "wandb", "project": "p", "entity": None, "mode": "offline", "tags": [],
                               "run_name": None, "group": None})
    tracker = Tracker(tmp_path, logger, {"name": "toy"}, "train")
    records = [{"role": "solver", "reward": 0.5, "judge_score": 0.5}, {"role": "judge", "reward": 1.0}]
    tracker.log_samples(20, records, "train/completions")
    tracker.wandb.finish()
    assert [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == records
