"""The paper experiment files under conf/experiment/paper/: AT-GRPO table cells and M-GRPO comparison rows.

- Every cell of the two AT-GRPO results tables has its file, filed under the paper's row and column labels with
  the paper's number (the tables are embedded below: PAPERS.md is not part of the checkout), and with the
  paper-era hyperparameters; the M-GRPO rows carry the paper's settings.
- Every paper experiment composes under ``train`` and under ``eval``.
- Every paper experiment dry-runs on CPU in-process (``dry_run=cpu``, or ``dry_run=cpu_embedded`` where the data
  come from the hub): one RL step of the tiny model, then its evaluation. A dry run takes seconds, so the default
  suite runs one per distinct dry-run config: many files compose to the same dry-run config once name, report
  and model are set aside (the Qwen3-1.7B and Qwen3-8B twins of a cell; the untrained and trained rows of one
  workflow, since the dry run trains one step either way; benchmarks whose hub data the dry run swaps for the
  same embedded tasks). Those are marked ``slow`` (``make test-all``): they are covered by the composed-config
  equality with a file that runs in the default suite (``DEFAULT_DRY_RUNS``), which a slow test checks.
"""

from __future__ import annotations

import copy
import json
from functools import cache

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from tests.helpers import TINY, torch_threads

register_configs()
CONF = config_dir()
PAPER = CONF / "experiment" / "paper"

MODELS = {"qwen3_1_7b": "Qwen3-1.7B", "qwen3_8b": "Qwen3-8B"}
BENCHMARKS = {  # file name → (the paper's column label, task family)
    "sudoku": ("Sudoku", "games"), "sokoban": ("Sokoban", "games"), "plan_path": ("Plan-Path", "games"),
    "livecodebench": ("LiveCodeBench", "code"), "apps": ("APPS", "code"), "codecontests": ("CodeContests", "code"),
    "aime24": ("AIME24", "math"), "aime25": ("AIME25", "math"), "olympiadbench": ("OlympiadBench", "math"),
}
METHODS = {  # file name → the paper's row label
    "single": "single agent",
    "single_grpo": "single agent + GRPO",
    "mas_prompt": "MAS, prompt only",
    "at_grpo_shared": "AT-GRPO, shared policy",
    "at_grpo_per_role": "AT-GRPO, per-role policies",
}
# The two results tables (accuracy %): rows in METHODS order, columns in BENCHMARKS order.
TABLES = {
    "qwen3_1_7b": {
        "single": [7, 0, 5, 11.6, 16.2, 3.6, 13.4, 9.8, 22.2],
        "single_grpo": [29, 3, 11, 18.8, 17.0, 3.0, 10.0, 6.7, 23.8],
        "mas_prompt": [69, 0, 10, 19.0, 16.6, 3.6, 13.3, 13.0, 35.9],
        "at_grpo_shared": [99, 10, 96, 20.9, 17.6, 4.8, 16.7, 16.7, 39.6],
        "at_grpo_per_role": [99, 11.5, 97, 24.0, 18.6, 7.8, 13.3, 18.3, 35.2],
    },
    "qwen3_8b": {
        "single": [48, 9, 12, 22.8, 30.2, 15.75, 18.3, 20.0, 55.0],
        "single_grpo": [54, 14, 47, 25.7, 37.0, 12.12, 18.3, 26.67, 54.8],
        "mas_prompt": [72, 16, 71, 28.0, 44.4, 17.6, 36.6, 30.0, 56.5],
        "at_grpo_shared": [99.5, 96, 93, 30.28, 45.8, 18.1, 50.0, 35.2, 56.8],
        "at_grpo_per_role": [99, 98, 96, 33.1, 46.5, 18.1, 57.0, 40.0, 56.6],
    },
}
FAMILY_WORKFLOW = {"games": "tool_plan", "code": "code_test", "math": "tool_reason"}
FAMILY_ENV = {"sudoku": "sudoku", "sokoban": "sokoban", "plan_path": "plan_path"}
EVAL_DATA = {  # benchmark → (env.eval.source, env.eval_size)
    "livecodebench": ("livecodebench", 500), "apps": ("apps", 500), "codecontests": ("code_contests", 165),
    "aime24": ("aime24", 30), "aime25": ("aime25", 30), "olympiadbench": ("olympiadbench", 674),
}
CELLS = [(m, b, r) for m in MODELS for b in BENCHMARKS for r in METHODS]

MGRPO_BENCHMARKS = {"gaia": ("GAIA", 165), "xbench": ("XBench-DeepSearch", 100), "webwalkerqa": ("WebWalkerQA", 680)}
MGRPO_ROWS = {
    "co_training": "M-GRPO, co-training",
    "frozen_sub": "M-GRPO, frozen sub-agent",
    "single_agent": "single agent (all tools)",
    "sync": "M-GRPO, synchronised",
    "async": "M-GRPO, not synchronised",
}
MGRPO_CELLS = [(b, r) for b in MGRPO_BENCHMARKS for r in MGRPO_ROWS]

ALL_FILES = sorted(str(p.relative_to(CONF / "experiment").with_suffix("")) for p in PAPER.rglob("*.yaml"))
LEAVES = [f"paper/at_grpo/{m}/{b}/{r}" for m, b, r in CELLS] + [f"paper/mgrpo/{b}/{r}" for b, r in MGRPO_CELLS]

@cache
def _compose(config_name: str, overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def _plain(experiment: str) -> DictConfig:
    """The experiment composed under ``eval`` (the app the untrained rows are for). It is the ``train`` config
    plus ``load`` and ``eval`` (checked below), and tests/config/test_compose.py composes every experiment under
    ``train``, so one composition per file serves the eval, label and hyperparameter checks."""
    return _compose("eval", (f"experiment={experiment}",))


def _dry_run_option(experiment: str) -> str:
    """``cpu`` for the generated grid games; ``cpu_embedded`` where the tasks come from the hub (math, code,
    research), which swaps them for the embedded ones."""
    games = [b for b, (_, family) in BENCHMARKS.items() if family == "games"]
    return "cpu" if experiment.split("/")[-2] in games else "cpu_embedded"


def _dry_run_overrides(experiment: str) -> tuple[str, ...]:
    return (f"experiment={experiment}", f"dry_run={_dry_run_option(experiment)}", *TINY,
            "progress=false")


def _dry_run_key(experiment: str) -> str:
    """The dry-run config with what does not change the run set aside: name, report labels, model."""
    cfg = OmegaConf.to_container(_compose("train", _dry_run_overrides(experiment)), resolve=False)
    for key in ("name", "report", "model"):
        cfg.pop(key)
    return json.dumps(cfg, sort_keys=True)


DEFAULT_DRY_RUNS = [
    *(f"paper/at_grpo/qwen3_1_7b/{b}/{m}" for b in ("sudoku", "sokoban", "plan_path", "livecodebench", "codecontests",
                                                   "aime24") for m in ("single", "mas_prompt", "at_grpo_per_role")),
    *(f"paper/mgrpo/gaia/{r}" for r in MGRPO_ROWS)]
"""One file per distinct dry-run config, run in the default suite (``test_dry_run_grouping`` checks the choice)."""


def _dry_run_params() -> list:
    """Every leaf: those in DEFAULT_DRY_RUNS in the default suite, the others slow."""
    return [pytest.param(e, id=e.removeprefix("paper/"), marks=[] if e in DEFAULT_DRY_RUNS else [pytest.mark.slow])
            for e in LEAVES]


# ---------------------------------------------------------------------------------------------
# AT-GRPO: one file per table cell


def test_every_at_grpo_cell_has_its_file_and_nothing_else():
    cells = {f"paper/at_grpo/{m}/{b}/{r}" for m, b, r in CELLS}
    assert len(cells) == 2 * 5 * 9
    missing = sorted(c for c in cells if not (CONF / "experiment" / f"{c}.yaml").is_file())
    assert missing == []
    pieces = {"paper/at_grpo/common"} | {f"paper/at_grpo/benchmarks/{b}" for b in BENCHMARKS} | {
        f"paper/at_grpo/models/{m}" for m in MODELS}
    assert {f for f in ALL_FILES if f.startswith("paper/at_grpo/")} == cells | pieces


def test_every_file_starts_with_the_global_package_and_a_comment():
    for experiment in ALL_FILES:
        lines = (CONF / "experiment" / f"{experiment}.yaml").read_text().splitlines()
        assert lines[0] == "# @package _global_", experiment
        assert lines[1].startswith("# ") and len(lines[1]) > 20, experiment


@pytest.mark.parametrize("model,benchmark,method", CELLS, ids=["/".join(c) for c in CELLS])
def test_at_grpo_cell_is_filed_with_the_papers_number(model, benchmark, method):
    experiment = f"paper/at_grpo/{model}/{benchmark}/{method}"
    cfg = _plain(experiment)
    label = BENCHMARKS[benchmark][0]
    value = TABLES[model][method][list(BENCHMARKS).index(benchmark)]
    assert cfg.name == f"paper_at_grpo_{model}_{benchmark}_{method}"
    assert cfg.report.table == f"Stronger-MAS (arXiv 2510.11062), {MODELS[model]}"
    assert cfg.report.method == METHODS[method]
    assert cfg.report.benchmark == label
    assert cfg.report.paper == pytest.approx(value)
    assert cfg.report.source == f"Stronger-MAS (arXiv 2510.11062), results table, {MODELS[model]}"
    assert f"{value}%" in (CONF / "experiment" / f"{experiment}.yaml").read_text().splitlines()[1]


@pytest.mark.parametrize("model,benchmark,method", CELLS, ids=["/".join(c) for c in CELLS])
def test_at_grpo_cell_has_the_paper_era_hyperparameters(model, benchmark, method):
    cfg = _plain(f"paper/at_grpo/{model}/{benchmark}/{method}")
    _, family = BENCHMARKS[benchmark]
    # model
    assert cfg.model.name_or_path == f"Qwen/{MODELS[model]}" and cfg.model.dtype == "bfloat16"
    # workflow, algorithm, regime of the row
    single = method.startswith("single")
    assert cfg.workflow.name == ("single_agent" if single else FAMILY_WORKFLOW[family])
    assert cfg.algorithm.name == ("grpo" if single else "at_grpo")
    assert cfg.algorithm.mode == ("independent" if single else "tree")
    assert cfg.policy.name == ("per_role" if method == "at_grpo_per_role" else "shared")
    trained = method not in ("single", "mas_prompt")
    assert cfg.trainer.steps == (400 if trained else 0)
    # paper-era settings shared by every cell
    assert cfg.algorithm.num_generations == 4
    assert cfg.rollout.tasks_per_step == 128
    assert cfg.workflow.max_turns == 3
    assert cfg.trainer.learning_rate == pytest.approx(1e-6)
    assert cfg.trainer.lr_scheduler_type == "constant" and cfg.trainer.warmup_steps == 0
    assert cfg.rollout.backend == "hf"
    assert cfg.rollout.temperature == (1.5 if family == "games" else 1.0)
    assert cfg.rollout.top_p == pytest.approx(0.9) and cfg.rollout.top_k == 20
    assert cfg.eval.temperature == (0.0 if family == "games" else pytest.approx(0.6))
    assert (cfg.rollout.max_prompt_length, cfg.rollout.max_new_tokens) == (4096, 2048)
    assert (cfg.trainer.epsilon, cfg.trainer.epsilon_high) == (0.2, 0.2)
    assert cfg.trainer.loss_type == "bnpo"  # token-mean
    assert cfg.trainer.beta == 0.0 and cfg.trainer.num_iterations == 1 and cfg.trainer.max_grad_norm == 1.0
    assert cfg.trainer.warmstart.enabled is False
    assert cfg.logger.name == "wandb" and cfg.seed == 0
    # environment and data
    if family == "games":
        assert cfg.env.name == FAMILY_ENV[benchmark] and cfg.env.eval_size == 100
        size = {"sudoku": 4, "sokoban": 6, "plan_path": 10}[benchmark]
        assert cfg.env.size == size
        if benchmark == "plan_path":
            assert cfg.env.block_prob == pytest.approx(0.22)
        if benchmark == "sokoban":
            assert cfg.env.max_moves == 200
    else:
        assert cfg.env.name == family
        assert cfg.env.train.source == ("polaris" if family == "math" else "code_contests")
        assert (cfg.env.eval.source, cfg.env.eval_size) == EVAL_DATA[benchmark]
    assert cfg.env.actions_per_episode == 3


def test_twins_differ_only_in_model_and_report():
    for benchmark in BENCHMARKS:
        for method in METHODS:
            small, large = (OmegaConf.to_container(_plain(f"paper/at_grpo/{m}/{benchmark}/{method}"))
                            for m in MODELS)
            for cfg in (small, large):
                for key in ("name", "report", "model"):
                    cfg.pop(key)
            assert small == large, (benchmark, method)


# ---------------------------------------------------------------------------------------------
# M-GRPO: the figures' comparisons


@pytest.mark.parametrize("benchmark,row", MGRPO_CELLS, ids=["/".join(c) for c in MGRPO_CELLS])
def test_mgrpo_row_has_the_papers_settings(benchmark, row):
    cfg = _plain(f"paper/mgrpo/{benchmark}/{row}")
    label, eval_size = MGRPO_BENCHMARKS[benchmark]
    assert cfg.name == f"paper_mgrpo_{benchmark}_{row}"
    assert cfg.report.table == "M-GRPO (arXiv 2511.13288)"
    assert cfg.report.method == MGRPO_ROWS[row] and cfg.report.benchmark == label
    assert cfg.report.paper is None and "figure" in cfg.report.source and label in cfg.report.source
    assert cfg.env.name == "research" and cfg.env.train.source == "embedded"
    assert (cfg.env.eval.source, cfg.env.eval_size, cfg.env.eval.limit) == (benchmark, eval_size, 0)
    assert cfg.algorithm.name == "m_grpo"
    assert (cfg.algorithm.num_generations, cfg.algorithm.align_d) == (8, 8)
    assert cfg.trainer.learning_rate == pytest.approx(1e-6) and cfg.trainer.lr_scheduler_type == "constant"
    assert cfg.trainer.weight_decay == pytest.approx(0.1)
    assert (cfg.trainer.epsilon, cfg.trainer.epsilon_high) == (0.2, pytest.approx(0.28))
    assert cfg.trainer.beta == 0.0
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.max_new_tokens == 1024
    assert (cfg.workflow.main_format, cfg.workflow.main_correct) == (0.1, 0.9)
    assert (cfg.workflow.sub_format, cfg.workflow.sub_main_correct, cfg.workflow.sub_expert) == (0.1, 0.4, 0.5)
    assert cfg.model.name_or_path.startswith("Qwen/Qwen3-") and cfg.model.dtype == "bfloat16"
    assert cfg.trainer.warmstart.enabled is False and cfg.trainer.role == "all"
    if row == "single_agent":
        assert (cfg.workflow.name, cfg.policy.name) == ("solo_research", "shared")
        assert (cfg.workflow.max_turns, cfg.workflow.max_calls) == (20, 19)  # 19 tool actions, then the answer
    else:
        assert (cfg.workflow.name, cfg.policy.name) == ("deep_research", "per_role")
        assert (cfg.workflow.max_calls, cfg.workflow.sub_turns) == (19, 20)  # 20 turns per agent
        assert cfg.workflow.max_turns == 20 + 19 * 20
    assert list(cfg.trainer.frozen_roles) == (["sub"] if row == "frozen_sub" else [])
    assert cfg.store.name == ("redis" if row in ("sync", "async") else "sqlite")
    assert cfg.trainer.max_staleness == (100 if row == "async" else 0)


def test_every_mgrpo_row_has_its_file_and_nothing_else():
    expected = {"paper/mgrpo/common"} | {f"paper/mgrpo/{b}/{r}" for b, r in MGRPO_CELLS}
    assert {f for f in ALL_FILES if f.startswith("paper/mgrpo/")} == expected


# ---------------------------------------------------------------------------------------------
# Composition under eval, and dry runs


@pytest.mark.parametrize("experiment", ALL_FILES, ids=[f.removeprefix("paper/") for f in ALL_FILES])
def test_composes_under_eval(experiment):
    cfg = _plain(experiment)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert cfg.name.startswith("paper_") and cfg.load is None


@pytest.mark.parametrize("experiment", ["paper/at_grpo/common", "paper/at_grpo/qwen3_8b/sokoban/at_grpo_per_role",
                                        "paper/at_grpo/qwen3_1_7b/aime25/single",
                                        "paper/at_grpo/qwen3_1_7b/apps/mas_prompt", "paper/mgrpo/gaia/async",
                                        "paper/mgrpo/webwalkerqa/single_agent"])
def test_train_composes_the_eval_config_without_load(experiment):
    trained = OmegaConf.to_container(_compose("train", (f"experiment={experiment}",)))
    evaluated = OmegaConf.to_container(_plain(experiment))
    assert evaluated.pop("load") is None and set(evaluated["eval"]) == {"samples", "temperature", "pass_k", "roles",
                                                                         "league"}
    assert trained == evaluated


@pytest.fixture
def one_thread():
    """Torch on one thread: the tiny model's dry runs are several times faster on a shared 2-core machine."""
    with torch_threads(1):
        yield


@pytest.mark.parametrize("experiment", _dry_run_params())
def test_dry_run(experiment, tmp_path, monkeypatch, one_thread):
    from marl_cli.training.loop import train

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = copy.deepcopy(_compose("train", _dry_run_overrides(experiment)))
    assert _dry_run_option(experiment) == ("cpu" if cfg.env.name in FAMILY_ENV else "cpu_embedded")
    assert cfg.trainer.steps == 1  # dry_run trains one step, also for the untrained (trainer.steps=0) rows
    assert cfg.model.name_or_path is None and cfg.logger.name == "none"
    if cfg.env.name in ("math", "code", "research"):
        assert cfg.env.train.source == cfg.env.eval.source == "embedded"
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 1
    assert (summary["workflow"], summary["algorithm"], summary["regime"]) == (
        cfg.workflow.name, cfg.algorithm.name, cfg.policy.name)
    for prefix in ("eval_before", "eval"):
        assert summary[f"{prefix}/tasks"] == 2
        assert 0.0 <= summary[f"{prefix}/success"] <= 1.0
        assert f"{prefix}/{cfg.env.name}/success" in summary
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == "completed"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/success" in r] == [1]


def test_dry_run_alone_replaces_the_hub_model():
    cfg = _compose("train", ("experiment=paper/at_grpo/qwen3_1_7b/sudoku/single", "dry_run=cpu"))
    assert cfg.model.name_or_path is None and cfg.model.dtype == "float32"


@pytest.mark.slow
def test_dry_run_grouping_keeps_one_run_per_distinct_config():
    params = _dry_run_params()
    default = [p.values[0] for p in params if not p.marks]
    assert default == [e for e in LEAVES if e in DEFAULT_DRY_RUNS]
    assert len(params) == len(LEAVES)
    assert len({_dry_run_key(e) for e in default}) == len(default)  # each runs a distinct config
    assert {_dry_run_key(e) for e in LEAVES} == {_dry_run_key(e) for e in default}  # and every config runs
    assert not [e for e in default if e.startswith("paper/at_grpo/qwen3_8b/")]  # the 8B twins are all slow
