"""The paper cells of the self-evolving teams (conf/experiment/paper/self_evolving/: MAE, SSP, CoMAS, MAPoRL, SPA-RL):
each carries its paper's model and roles, and dry-runs on CPU in-process (one RL step of the tiny model, then its
evaluation)."""

from __future__ import annotations

import copy

import pytest
from hydra import compose, initialize_config_dir

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from tests.helpers import TINY, torch_threads

register_configs()
CELLS = {  # file → (the paper's model, workflow, reward)
    "mae": ("Qwen/Qwen2.5-3B-Instruct", "propose_solve_judge", "none"),
    "ssp": ("Qwen/Qwen2.5-7B-Instruct", "propose_solve", "none"),
    "comas": ("Qwen/Qwen2.5-3B-Instruct", "discussion", "none"),
    "maporl": ("microsoft/Phi-3-mini-128k-instruct", "debate", "none"),
    "spa": ("meta-llama/Llama-3.2-3B-Instruct", "single_agent", "progress"),
}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_every_cell_has_its_file_and_nothing_else():
    files = sorted(p.stem for p in (config_dir() / "experiment" / "paper" / "self_evolving").glob("*.yaml"))
    assert files == sorted(CELLS)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cell_carries_its_papers_model_and_workflow(cell):
    cfg = _compose(f"experiment=paper/self_evolving/{cell}")
    assert (cfg.model.name_or_path, cfg.workflow.name, cfg.reward.name) == CELLS[cell]


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_dry_run(cell, tmp_path, monkeypatch):
    from marl_cli.training.loop import train

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dry = "cpu" if cell == "spa" else "cpu_embedded"
    cfg = copy.deepcopy(_compose(f"experiment=paper/self_evolving/{cell}", f"dry_run={dry}", *TINY, "progress=false"))
    assert cfg.model.name_or_path is None and cfg.trainer.steps == 1
    with torch_threads(1):
        summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 1
    assert 0.0 <= summary["eval/success"] <= 1.0
