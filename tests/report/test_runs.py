"""Finding run dirs and reading their cell placement, value and reason."""

import json
import os
import socket
import subprocess

import pytest

from marl_cli.report.runs import (
    ReportError,
    benchmark_label,
    discover,
    last_logged_step,
    load_run,
    load_runs,
    method_label,
    setup_key,
)
from tests.report.rundirs import make_run


def test_discover_run_dirs_sweeps_and_globs(tmp_path):
    single = make_run(tmp_path, "outputs/a/2026-01-01_00-00-00")
    sweep = tmp_path / "multirun/x/2026-01-02_00-00-00"
    jobs = [make_run(sweep, f"trainer.learning_rate={lr}/seed={s}", seed=s) for lr in (0.01, 0.001) for s in (0, 1)]
    (sweep / "multirun.yaml").write_text("{}")
    (tmp_path / "empty").mkdir()

    assert discover([str(single)]) == [single]
    assert discover([str(tmp_path / "multirun")]) == [*jobs[2:], *jobs[:2]]  # numbers in order: 0.001 < 0.01
    assert discover([str(tmp_path / "multirun/x/*/trainer.learning_rate=0.01/*")]) == jobs[:2]
    # repeats are dropped, order follows the arguments
    assert discover([str(single), str(tmp_path / "outputs"), str(jobs[0])]) == [single, jobs[0]]
    # a summary.json named directly stands for its run dir
    assert discover([str(single / "summary.json")]) == [single]

    with pytest.raises(ReportError, match="no such file or directory"):
        discover([str(tmp_path / "nope")])
    with pytest.raises(ReportError, match="glob matches nothing"):
        discover([str(tmp_path / "nope*")])
    with pytest.raises(ReportError, match="no run directories"):
        discover([str(tmp_path / "empty")])


def test_discover_skips_report_dirs_and_keeps_runs_without_summary(tmp_path):
    run = make_run(tmp_path, "outputs/a/1", status=None)
    report = tmp_path / "outputs/report/1/.hydra"
    report.mkdir(parents=True)
    (report / "config.yaml").write_text("runs: [x]\nmetric: success\nplot: false\ndigits: 1\n")
    assert discover([str(tmp_path / "outputs")]) == [run]


def test_a_search_skips_the_empty_dirs_older_resumes_left(tmp_path, monkeypatch):
    run = make_run(tmp_path, "outputs/a/1")
    leftover = make_run(tmp_path, "outputs/a/2", status=None, overrides=[f"trainer.resume='{run}'"])
    in_place = make_run(tmp_path, "outputs/a/3", status=None, overrides=["trainer.resume=outputs/a/3"])
    monkeypatch.chdir(tmp_path)
    assert discover([str(tmp_path / "outputs")]) == [run, in_place]  # a resume in its own dir is the run itself
    assert discover([str(leftover)]) == [leftover]  # named on its own, it is listed


@pytest.mark.parametrize(("config", "command", "label"), [
    ({"workflow": {"name": "single_agent"}, "algorithm": {"name": "grpo"}, "trainer": {"steps": 0}}, "train",
     "single agent"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "at_grpo"}, "trainer": {"steps": 0}}, "train",
     "MAS, prompt only"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "at_grpo"}, "trainer": {"steps": 5}}, "eval",
     "MAS, prompt only"),
    ({"workflow": {"name": "solo_research"}, "algorithm": {"name": "grpo"}, "trainer": {"steps": 5}}, "train",
     "single agent + GRPO"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "at_grpo"}, "policy": {"name": "shared"},
      "trainer": {"steps": 5}}, "train", "AT-GRPO, shared policy"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "at_grpo"}, "policy": {"name": "per_role"},
      "trainer": {"steps": 5}}, "train", "AT-GRPO, per-role policies"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "at_grpo"}, "policy": {"name": "lora_per_role"},
      "trainer": {"steps": 5}}, "train", "AT-GRPO, LoRA per role"),
    ({"workflow": {"name": "deep_research"}, "algorithm": {"name": "m_grpo"},
      "trainer": {"steps": 5, "frozen_roles": []}}, "train", "M-GRPO"),
    ({"workflow": {"name": "deep_research"}, "algorithm": {"name": "m_grpo"},
      "trainer": {"steps": 5, "frozen_roles": ["sub"]}}, "train", "M-GRPO, frozen sub"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "ppo"}, "trainer": {"steps": 5}}, "train", "ppo"),
    ({"workflow": {"name": "tool_plan"}, "algorithm": {"name": "not_loaded"}, "trainer": {"steps": 5}}, "train",
     "not_loaded"),  # a plug-in this process has not loaded: its name
])
def test_method_labels(config, command, label):
    assert method_label(config, command) == label


@pytest.mark.parametrize(("env", "label"), [
    ({"name": "plan_path"}, "Plan-Path"), ({"name": "sudoku"}, "Sudoku"), ({"name": "sokoban"}, "Sokoban"),
    ({"name": "math", "eval": {"source": "aime24"}}, "AIME24"),
    ({"name": "math", "eval": {"source": "olympiadbench"}}, "OlympiadBench"),
    ({"name": "math", "eval": {"source": "embedded"}}, "Math (embedded)"),
    ({"name": "code", "eval": {"source": "livecodebench"}}, "LiveCodeBench"),
    ({"name": "code", "eval": {"source": "code_contests"}}, "CodeContests"),
    ({"name": "code", "eval": {"source": "embedded"}}, "Code (embedded)"),
    ({"name": "research", "eval": {"source": "xbench"}}, "XBench-DeepSearch"),
    ({"name": "research", "eval": {"source": "embedded"}}, "Research (embedded)"),
    ({"name": "math", "eval": {"source": "someone/my_set"}}, "someone/my_set"),
])
def test_benchmark_labels(env, label):
    assert benchmark_label({"env": env}) == label


def test_completed_run_value_and_labels(tmp_path):
    run = load_run(make_run(tmp_path, "r", success=0.56, before=0.53, seed=2,
                            report={"before_method": "single agent", "paper": 11, "source": "paper T1"}))
    assert run.status == "completed"
    assert run.value == pytest.approx(56.0)
    assert run.before == pytest.approx(53.0)
    assert (run.table, run.method, run.benchmark, run.seed) == ("runs", "single agent + GRPO", "Plan-Path", 2)
    assert (run.before_method, run.paper, run.source) == ("single agent", 11.0, "paper T1")
    assert run.reason is None


def test_a_running_run_whose_process_is_gone_says_so(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    summary = {"steps": 5, "total_steps": 10, "pid": gone.pid, "host": socket.gethostname(), "run_dir": "/r"}
    run = load_run(make_run(tmp_path, "gone", status="running", steps=10, summary=summary))
    assert run.reason == (f"status running (step 5 of 10), but its process {gone.pid} is gone (killed?): resume it "
                          "with trainer.resume=/r")
    alive = load_run(make_run(tmp_path, "alive", status="running", steps=10, summary={**summary, "pid": os.getpid()}))
    assert alive.reason == "status running (step 5 of 10)"


def test_a_dry_run_is_its_own_row_without_the_paper_number(tmp_path):
    run = load_run(make_run(tmp_path, "r", overrides=["dry_run=cpu"], report={"method": "AT-GRPO", "paper": 99}))
    assert run.method == "AT-GRPO [dry run: cpu]" and run.paper is None


def test_report_node_overrides_derived_labels(tmp_path):
    run = load_run(make_run(tmp_path, "r", report={"table": "T", "method": "mine", "benchmark": "B"}))
    assert (run.table, run.method, run.benchmark) == ("T", "mine", "B")


def test_reasons_for_runs_without_a_result(tmp_path):
    no_summary = load_run(make_run(tmp_path, "a", status=None))
    failed = load_run(make_run(tmp_path, "b", status="failed", success=None,
                               summary={"error": "RuntimeError: CUDA out of memory\ntraceback..."}))
    running = load_run(make_run(tmp_path, "c", status="running", success=None, summary={"steps": 3}))
    no_metric = load_run(make_run(tmp_path, "d", success=None))
    other_metric = load_run(make_run(tmp_path, "e", summary={"eval/pass@1": 0.25}), metric="pass@1")

    assert (no_summary.status, no_summary.reason, no_summary.value) == ("missing", "no summary.json", None)
    assert no_summary.method == "single agent + GRPO"  # placed from its config all the same
    assert failed.reason == "status failed: RuntimeError: CUDA out of memory"
    assert running.reason == "status running (step 3 of 10)"
    assert no_metric.reason == "no eval/success"
    assert other_metric.value == pytest.approx(25.0)


def test_run_without_config_is_placed_from_its_summary(tmp_path):
    path = make_run(tmp_path, "old", env="sudoku", workflow="tool_plan", algorithm="at_grpo", policy="per_role",
                    write_config=False, success=0.9)
    data = json.loads((path / "summary.json").read_text())
    del data["command"]  # older runs
    (path / "summary.json").write_text(json.dumps(data))
    run = load_run(path)
    assert (run.command, run.method, run.benchmark, run.value) == ("train", "AT-GRPO, per-role policies", "Sudoku",
                                                                   pytest.approx(90.0))


def test_eval_runs(tmp_path):
    trained = make_run(tmp_path, "outputs/toy_grpo/1", config={"name": "toy_grpo"})
    ckpt = trained / "checkpoints" / "step_000010"
    ckpt.mkdir(parents=True)
    of_run = make_run(tmp_path, "outputs/eval/1", summary={"command": "eval"},
                      config={"load": str(ckpt), "eval": {"samples": 1}})
    of_gone = make_run(tmp_path, "outputs/eval/2", summary={"command": "eval"},
                       config={"load": "/gone/runs/2026-01-01", "eval": {"samples": 1}})
    prompt_only = make_run(tmp_path, "outputs/eval/3", workflow="tool_plan", summary={"command": "eval"},
                           config={"load": None, "eval": {"samples": 1}})
    by_summary = make_run(tmp_path, "outputs/eval/4", summary={"command": "eval", "loaded_name": "from_summary",
                                                               "loaded_run": str(trained)},
                          config={"load": "somewhere/else", "eval": {"samples": 1}})
    assert load_run(of_run).method == "eval of toy_grpo"
    assert load_run(by_summary).method == "eval of from_summary"
    assert load_run(by_summary).key == load_run(of_run).key  # both evaluate the same trained run
    assert load_run(of_gone).method == "eval of runs/2026-01-01"
    assert load_run(prompt_only).method == "MAS, prompt only"


def test_setup_key_ignores_seed_and_bookkeeping_only(tmp_path):
    base = {"env": {"name": "sudoku"}, "trainer": {"learning_rate": 0.1, "resume": None}, "seed": 0,
            "logger": {"name": "wandb"}, "progress": True}
    same = {**base, "seed": 3, "trainer": {"learning_rate": 0.1, "resume": "/x"}, "logger": {"name": "none"},
            "progress": False}
    other = {**base, "trainer": {"learning_rate": 0.01, "resume": None}}
    assert setup_key(base) == setup_key(same)
    assert setup_key(base) != setup_key(other)


def test_a_run_saved_before_a_key_existed_has_the_setup_of_one_at_its_default():
    """marl added ``critic.share_trunk`` and ``trainer.mask_truncated_completions`` (defaults false): a run saved
    without them groups with one that leaves them there, not with one that sets them."""
    older = {"env": {"name": "plan_path"}, "trainer": {"learning_rate": 0.1}, "critic": {"name": "ppo_like"}}
    newer = {"env": {"name": "plan_path"}, "trainer": {"learning_rate": 0.1, "mask_truncated_completions": False},
             "critic": {"name": "ppo_like", "share_trunk": False}}
    assert setup_key(older) == setup_key(newer)
    assert setup_key(older) != setup_key({**newer, "trainer": {"learning_rate": 0.1,
                                                               "mask_truncated_completions": True}})
    assert setup_key(older) != setup_key({**newer, "critic": {"name": "ppo_like", "share_trunk": True}})


def test_a_run_saved_with_epo_as_trainer_keys_off_has_the_setup_of_one_without_a_loss_term():
    older = {"env": {"name": "plan_path"}, "trainer": {"learning_rate": 0.1, "epo_coef": 0.0, "epo_window": 0}}
    newer = {"env": {"name": "plan_path"}, "trainer": {"learning_rate": 0.1}, "loss": {"name": "none"},
             "credit": {"name": "none"}}
    assert setup_key(older) == setup_key(newer)
    assert setup_key(newer) != setup_key({**newer, "loss": {"name": "epo", "coef": 0.01}})


def test_load_runs_reads_every_discovered_dir(tmp_path):
    for s in range(3):
        make_run(tmp_path, f"sweep/seed={s}", seed=s, success=0.1 * s)
    runs = load_runs([str(tmp_path / "sweep")])
    assert [r.seed for r in runs] == [0, 1, 2]
    assert [r.value for r in runs] == pytest.approx([0.0, 10.0, 20.0])
    assert len({r.key for r in runs}) == 1


def test_sweep_jobs_come_in_natural_order(tmp_path):
    for s in (10, 2, 1):
        make_run(tmp_path, f"sweep/seed={s}", seed=s)
    assert [p.name for p in discover([str(tmp_path / "sweep")])] == ["seed=1", "seed=2", "seed=10"]
    assert [p.name for p in discover([str(tmp_path / "sweep/seed=*")])] == ["seed=1", "seed=2", "seed=10"]
    make_run(tmp_path, "lr/0.1", lr=0.1)
    make_run(tmp_path, "lr/0.05", lr=0.05)
    assert [p.name for p in discover([str(tmp_path / "lr")])] == ["0.05", "0.1"]


def test_a_running_run_reports_the_last_step_its_metrics_logged(tmp_path):
    path = make_run(tmp_path, "r", status="running", success=None, summary={"steps": 0})
    lines = [json.dumps({"step": step, "train/reward": 0.5}) for step in range(1, 8)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 8, "train/rew')  # a line cut mid-write
    assert load_run(path).reason == "status running (step 7 of 10)"
    assert last_logged_step(path / "missing.jsonl") is None


@pytest.mark.parametrize(("metric", "factor"), [("success", 100.0), ("pass@4", 100.0), ("player_0/win", 100.0),
                                                ("vs_mcts/player_1/win", 100.0), ("nash_conv", 1.0),
                                                ("nash_conv/kuhn_poker", 1.0), ("games", 1.0)])
def test_rates_are_shown_in_percent_and_other_figures_as_they_are(metric, factor):
    from marl_cli.report.runs import scale

    assert scale(metric) == factor
