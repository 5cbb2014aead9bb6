"""The team experiments (``conf/experiment/hetero/``, CORY's and the toy table's team rows) compose with what
they say, and the hub-model ones dry-run on CPU with tiny models of two sizes standing in."""

import json
from pathlib import Path

import pytest

from marl_cli.config.paths import config_dir
from marl_cli.config.team import policy_model
from marl_cli.training.loop import train
from tests.helpers import TINY, torch_threads, train_config

EXPERIMENTS = sorted(str(p.relative_to(config_dir() / "experiment").with_suffix(""))
                     for p in (config_dir() / "experiment").rglob("*.yaml") if "hetero" in p.stem or "hetero" in
                     p.parent.name or "cory" in str(p))


def test_there_are_team_experiments_of_both_kinds():
    assert {"hetero/mgrpo_gaia", "hetero/at_grpo_plan_path", "hetero/at_grpo_aime24", "toy/table/plan_path_hetero",
            "toy/table/plan_path_cory", "cory/math"} <= set(EXPERIMENTS)


def test_the_heterogeneous_mgrpo_team_has_two_models_and_its_own_sub_settings():
    cfg = train_config("experiment=hetero/mgrpo_gaia")
    assert (cfg.workflow.name, cfg.algorithm.name, cfg.policy.name) == ("deep_research", "m_grpo", "per_role")
    assert policy_model(cfg, "main").name_or_path == "Qwen/Qwen3-8B"
    assert policy_model(cfg, "sub").name_or_path == "Qwen/Qwen3-1.7B"
    assert cfg.policy.trainers.sub.learning_rate == 2 * cfg.trainer.learning_rate
    assert cfg.env.eval.source == "gaia" and cfg.report.table == "Heterogeneous teams"


@pytest.mark.parametrize(("experiment", "roles", "train_t", "eval_t"), [
    ("hetero/at_grpo_plan_path", ("tool", "plan"), 1.5, 0.0),
    ("hetero/at_grpo_aime24", ("tool", "reasoner"), 1.0, 0.6)])
def test_the_at_grpo_cells_sample_per_role_as_the_paper(experiment, roles, train_t, eval_t):
    from marl_cli.training.build import sampling_from

    cfg = train_config(f"experiment={experiment}")
    train_sampling, eval_sampling = sampling_from(cfg), sampling_from(cfg, evaluation=True)
    for role in roles:
        mine = train_sampling.for_role(role)
        assert (mine.temperature, mine.top_p, mine.top_k) == (train_t, 0.9, 20)
        assert eval_sampling.for_role(role).temperature == eval_t
    assert policy_model(cfg, "tool").name_or_path == "Qwen/Qwen3-1.7B"
    assert policy_model(cfg, roles[1]).name_or_path == "Qwen/Qwen3-8B"


@pytest.mark.parametrize(("experiment", "dry_run", "small"), [
    ("hetero/mgrpo_gaia", "cpu_embedded", "sub"), ("hetero/at_grpo_plan_path", "cpu", "tool")])
def test_a_team_experiment_dry_runs_on_cpu_with_two_tiny_models(experiment, dry_run, small, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with torch_threads(1):
        cfg = train_config(f"experiment={experiment}", f"dry_run={dry_run}", *TINY, "progress=false",
                           f"policy.models.{small}.name_or_path=null", f"policy.models.{small}.dtype=float32",
                           f"+policy.models.{small}.tiny.num_hidden_layers=2")
        summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 1
    layers = {name: json.loads((Path(tmp_path) / "checkpoints" / "step_000001" / "policies" / name /
                                "config.json").read_text())["num_hidden_layers"] for name in summary["policies"]}
    assert layers[small] == 2 and sorted(layers.values()) == [1, 2]
