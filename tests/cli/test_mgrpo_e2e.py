"""M-GRPO end to end: in-process co-training and a frozen sub-agent (this process), decoupled trainers over the
store (two `marl train` processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import StoreConfig
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs
from marl_cli.store import build_store
from marl_cli.training.loop import train
from tests.helpers import train_config
from tests.store.test_store import redis_server

register_configs()

SMALL = ["model.tiny.hidden_size=64", "model.tiny.intermediate_size=128", "model.tiny.num_hidden_layers=2",
         "model.tiny.num_attention_heads=2", "model.tiny.num_key_value_heads=1", "model.tiny.head_dim=32"]
RESEARCH = ["~experiment", "env=research", "env.min_hops=2", "env.max_hops=2", "env.eval_size=4",
            "workflow=deep_research", "algorithm=m_grpo", "algorithm.num_generations=3", "algorithm.align_d=2",
            "rollout.tasks_per_step=3", "rollout.max_new_tokens=28", "rollout.temperature=0.5",
            "trainer.learning_rate=1e-3", "logger=none", "progress=false"]


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> Path:
    """A checkpoint whose main and sub policies both start from one model warm-started on both roles' oracle
    demonstrations (so rollouts call the sub-agent and its results vary)."""
    run = tmp_path_factory.mktemp("warm") / "run"
    train(train_config(*SMALL, *RESEARCH, "policy=shared", "trainer.steps=0", "trainer.warmstart.enabled=true",
                       "trainer.warmstart.num_examples=600", "trainer.warmstart.epochs=3",
                       "trainer.warmstart.learning_rate=3e-3"), run)
    shared = run / "checkpoints" / "step_000000" / "policies" / "shared"
    checkpoint = run.parent / "per_role"
    for name in ("main", "sub"):
        shutil.copytree(shared, checkpoint / "policies" / name)
    return checkpoint


def _from(checkpoint: Path) -> list[str]:
    return [*SMALL, *RESEARCH, "policy=per_role", f"trainer.init_from={checkpoint}"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_in_process_mgrpo_updates_main_and_sub(warm_model, tmp_path):
    run = tmp_path / "run"
    train(train_config(*_from(warm_model), "trainer.steps=3"), run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algorithm"] == "m_grpo"
    steps = [m for m in _metrics(run) if "train/reward" in m]
    assert len(steps) == 3
    for key in ("train/main/reward", "train/sub/reward", "train/sub/d_mean", "train/sub/d_max", "train/sub/d_over_D",
                "train/sub/duplicated", "train/sub/dropped", "train/main/success", "train/sub/success"):
        assert all(key in m for m in steps), key
    assert any(m["train/sub/rows"] > 0 and m["train/sub/grad_norm"] > 0 for m in steps)
    assert any(m["train/main/grad_norm"] > 0 for m in steps)
    final = run / "checkpoints" / "step_000003" / "policies"
    for name in ("main", "sub"):  # both policies moved away from where they started
        start, moved = _weights(warm_model / "policies" / name), _weights(final / name)
        assert any(not torch.equal(start[k], moved[k]) for k in moved), name


def test_frozen_sub_keeps_its_weights(warm_model, tmp_path):
    run = tmp_path / "run"
    train(train_config(*_from(warm_model), "trainer.steps=2", "trainer.frozen_roles=[sub]"), run)
    start, final = _weights(warm_model / "policies" / "sub"), run / "checkpoints" / "step_000002" / "policies"
    assert all(torch.equal(start[k], v) for k, v in _weights(final / "sub").items())
    assert not any("train/sub/grad_norm" in m for m in _metrics(run))


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    exe = Path(sys.executable).with_name("marl")
    return subprocess.Popen([str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen, timeout: float = 420) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]


def test_decoupled_trainers_over_sqlite_survive_a_killed_sub(warm_model, tmp_path):
    steps = 4
    store = ["store=sqlite", f"store.path={tmp_path / 'store.sqlite'}", "store.namespace=t", "store.poll_s=0.1"]
    common = [*_from(warm_model), *store, f"trainer.steps={steps}"]
    main = _spawn("train", *common, "trainer.role=main", f"hydra.run.dir={tmp_path / 'main'}")
    sub = _spawn("train", *common, "trainer.role=sub", f"hydra.run.dir={tmp_path / 'sub'}")
    deadline = time.time() + 300
    while not (tmp_path / "sub" / "checkpoints" / "step_000002").exists():
        assert time.time() < deadline and sub.poll() is None and main.poll() in (None, 0)
        time.sleep(0.2)
    sub.send_signal(signal.SIGKILL)
    sub.wait()
    resumed = _spawn("train", *common, "trainer.role=sub", f"trainer.resume={tmp_path / 'sub'}")
    _finish(main)
    _finish(resumed)
    main_summary = json.loads((tmp_path / "main" / "summary.json").read_text())
    sub_summary = json.loads((tmp_path / "sub" / "summary.json").read_text())
    assert main_summary["status"] == sub_summary["status"] == "completed"
    assert sub_summary["steps"] == main_summary["steps"] == steps
    db = build_store(OmegaConf.structured(StoreConfig(name="sqlite", namespace="t",
                                                      path=str(tmp_path / "store.sqlite"))))
    written = [db.count(f"sub/{s}") for s in range(1, steps + 1)]
    assert [db.acked(f"sub/{s}", "sub") for s in range(1, steps + 1)] == written  # every item consumed once
    assert sum(written) > 0
    assert main_summary["store/trajectories"] == sub_summary["store/trajectories"] == sum(written)
    assert db.get("weights")["version"] == steps
    main_steps = [m for m in _metrics(tmp_path / "main") if "train/reward" in m]
    assert all(m["store/lag_steps"] == 0 for m in main_steps)  # synchronous: every rollout used the newest sub
    assert "eval/research/success" in main_summary and "eval/research/success" not in sub_summary


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server not installed: apt-get install redis-server")
def test_decoupled_trainers_over_redis_asynchronous(warm_model, tmp_path):
    with redis_server(tmp_path / "redis", "--requirepass", "pw") as port:  # returns once the server answers
        store = ["store=redis", "store.host=127.0.0.1", f"store.port={port}", "store.password=pw",
                 "store.namespace=r", "store.poll_s=0.1"]
        common = [*_from(warm_model), *store, "trainer.steps=2", "trainer.max_staleness=1"]
        main = _spawn("train", *common, "trainer.role=main", f"hydra.run.dir={tmp_path / 'main'}")
        sub = _spawn("train", *common, "trainer.role=sub", f"hydra.run.dir={tmp_path / 'sub'}")
        _finish(main)
        _finish(sub)
    main_summary = json.loads((tmp_path / "main" / "summary.json").read_text())
    sub_summary = json.loads((tmp_path / "sub" / "summary.json").read_text())
    assert main_summary["store/trajectories"] == sub_summary["store/trajectories"]
    sub_steps = [m for m in _metrics(tmp_path / "sub") if "train/reward" in m]
    assert [m["step"] for m in sub_steps] == [1, 2] and all(m["store/lag_steps"] >= 0 for m in sub_steps)
    assert all(m["async/staleness_max"] <= 1 for m in sub_steps)  # the sub rows: at most one update old


def test_config_errors(tmp_path):
    for overrides, message in (([*RESEARCH, "policy=shared", "trainer.role=sub"], "own full model"),
                               (["trainer.role=main"], "needs algorithm=m_grpo"),
                               (["env=research", "workflow=solo_research"], "rewards whole trajectories")):
        with pytest.raises(ConfigError, match=message):
            check_overrides("train", [*SMALL, *overrides])
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*SMALL, "logger=none", f"trainer.init_from={tmp_path}"])
    with pytest.raises(ConfigError, match=r"no saved model for policies \['shared'\]"):
        train(cfg, tmp_path / "w")
