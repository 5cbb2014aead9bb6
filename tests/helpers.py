"""Helpers shared by tests: the fastest settings that still exercise the whole loop."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.rollout.generation import Generation

TINY = [
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_hidden_layers=1",
    "model.tiny.num_attention_heads=2", "model.tiny.num_key_value_heads=1", "model.tiny.head_dim=16",
]
SMALL = ["model.tiny.hidden_size=64", "model.tiny.intermediate_size=128", "model.tiny.num_hidden_layers=2",
         "model.tiny.head_dim=32"]
"""A tiny model smaller still: a quarter of the warm start's cost where a test needs a model that has learnt."""
FAST = [
    "~experiment",  # the bare group defaults: `marl train` would start from experiment=embedded
    *TINY, "env.size=4", "env.eval_size=6", "rollout.tasks_per_step=2", "rollout.max_new_tokens=12",
    "algorithm.num_generations=3", "trainer.learning_rate=1e-3", "logger=none", "progress=false",
]


def marl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the ``marl`` console script as a user would, in a new process (for what only a process shows:
    the entry point, start-up time, two cooperating processes)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    exe = Path(sys.executable).with_name("marl")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Torch on ``threads`` threads inside the block, the caller's count restored after (float sums depend on the
    split; one thread makes the tiny model's runs several times faster on a shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def install_plugin(monkeypatch, where: Path, module: str, source: str, yamls: dict[str, str],
                   registries: list) -> str:
    """A user's plug-in for one test: ``source`` as ``<where>/<module>.py`` named in MARL_PLUGINS and ``yamls`` under
    ``<where>/conf`` (returned, for ``--config-dir``); ``registries`` and the import state are restored after."""
    import textwrap

    from marl_cli.config import registry
    from marl_cli.config.registry import PLUGIN_ENV

    for reg in registries:
        for attribute in ("_entries", "schemas", "checks"):
            monkeypatch.setattr(reg, attribute, dict(getattr(reg, attribute)))
    monkeypatch.setattr(registry, "_loaded", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delitem(sys.modules, module, raising=False)
    (where / f"{module}.py").write_text(textwrap.dedent(source))
    conf = where / "conf"
    for path, text in yamls.items():
        (conf / path).parent.mkdir(parents=True, exist_ok=True)
        (conf / path).write_text(text)
    monkeypatch.setenv(PLUGIN_ENV, str(where / f"{module}.py"))
    register_configs()
    return str(conf)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node <processes> -m marl_cli train <args>`` on the CPU (gloo, one thread each)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                           "--master_port", str(free_port()), "-m", "marl_cli", "train", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``marl <args>`` in this process (``marl_cli.cli.main.main``): the same argument parsing, override
    checks, Hydra app, launcher and sweeper as the console script, without a new interpreter's imports.
    Returns what ``marl`` would: the exit code and what it printed."""
    from marl_cli.cli.main import main

    stdout, stderr, argv = io.StringIO(), io.StringIO(), sys.argv
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:], root.level = handlers, level  # Hydra's job logging (run dir's log file) ends with the run
    return subprocess.CompletedProcess(["marl", *args], code, stdout.getvalue(), stderr.getvalue())


class ScriptedGenerator:
    """Answers each prompt with ``answer(policy name, prompt, rng)``; counts one call per policy batch."""

    def __init__(self, answer, seed: int = 0):
        self.answer = answer
        self.rng = random.Random(seed)
        self.calls = 0
        self.batches: list[tuple[str, int]] = []
        self.started: list[list[str]] = []

    def start(self, policies):
        """Records the policies a rollout is about to act with (the backend protocol's hook before each rollout)."""
        self.started.append([p.name for p in policies])

    def release(self):
        """Nothing to free (the backend protocol's hook before the policies train)."""

    def generate(self, policy, prompts, sampling):
        self.calls += 1
        self.batches.append((policy.name, len(prompts)))
        return [Generation([ord(c) for c in p], [5, 1], self.answer(policy.name, p, self.rng)) for p in prompts]


def train_config(*overrides: str) -> DictConfig:
    """``conf/train.yaml`` composed with ``overrides``, as ``marl train`` would run it (in this process)."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def refusal(overrides: list[str], search_dirs: list[str] = ()) -> str:
    """The one-line ``ConfigError`` that checking ``marl train <overrides>`` raises (a failure if none, or several
    lines)."""
    from marl_cli.config.errors import ConfigError
    from marl_cli.config.validate import check_overrides

    register_configs()
    try:
        check_overrides("train", overrides, list(search_dirs))
    except ConfigError as exc:
        assert "\n" not in str(exc), str(exc)
        return str(exc)
    raise AssertionError(f"marl train {' '.join(overrides)} was not refused")


def metric_records(run: Path) -> list[dict]:
    """Every line of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def step_records(run: Path) -> list[dict]:
    """The training steps' lines of a run's ``metrics.jsonl``."""
    return [r for r in metric_records(run) if "train/success" in r]
