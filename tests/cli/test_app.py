import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from marl_cli.cli import eval as eval_cli
from marl_cli.cli import train as train_cli
from marl_cli.cli.app import (
    config_dirs_in,
    inherited_overrides,
    overrides_in,
    quoted_paths,
    remove_if_empty,
    run_app,
    run_job,
    split_args,
)
from marl_cli.cli.first_run import Recipe, recipe_for
from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.provenance import version
from tests.helpers import cli

register_configs()


def test_overrides_skip_flags_and_their_values():
    args = ["-m", "a=1", "--config-name", "train", "+b=2,3", "-cd", "/x", "~c"]
    assert overrides_in(args) == ["a=1", "+b=2,3", "~c"]
    assert split_args(["-cd", "seed=1", "seed=1", "--cfg", "job"]) == (["seed=1"], ["-cd", "seed=1", "--cfg", "job"])


def _started(args: list[str], capsys) -> tuple[list[str] | None, str]:
    """``marl train <args>`` up to Hydra: the argv Hydra would get (None: refused) and what was printed."""
    seen = []
    try:
        run_app("train", "train", lambda: seen.append(list(sys.argv)), args)
    except SystemExit as stop:
        assert stop.code == 2
    return (seen[0] if seen else None), capsys.readouterr().err


def test_printing_a_config_composes_it_first_and_takes_overrides_after_flags(capsys):
    argv, err = _started(["env=nope", "--cfg", "job"], capsys)
    assert argv is None and err.startswith("marl train: error: env=nope: no such option") and err.count("\n") == 1
    argv, _ = _started(["--cfg", "job", "env.size=3"], capsys)  # Hydra's parser would drop an override here
    assert argv == ["marl-train", "env.size=3", "--cfg", "job"]
    argv, _ = _started(["trainer.steps=-1", "--cfg", "job"], capsys)  # shown, though a run would refuse it
    assert argv == ["marl-train", "trainer.steps=-1", "--cfg", "job"]
    assert overrides_in(["--info", "defaults", "seed=1", "-c", "job"]) == ["seed=1"]
    argv, err = _started(["-m", "--cfg", "job", "seed=1,2"], capsys)
    assert argv is None and "-m and --cfg: give one of them" in err


def test_a_refused_start_removes_only_a_run_dir_with_nothing_in_it(tmp_path):
    fresh, measured, foreign = tmp_path / "fresh", tmp_path / "measured", tmp_path / "foreign"
    for run in (fresh, measured, foreign):
        (run / ".hydra").mkdir(parents=True)
        (run / "train.log").write_text("")
    (measured / "metrics.jsonl").write_text("{}\n")
    (foreign / "notes.txt").write_text("the user's own file")
    for run in (fresh, measured, foreign):
        remove_if_empty(run)
    assert not fresh.exists() and measured.exists() and foreign.exists()


def test_config_dirs_are_read_from_either_flag_form(tmp_path):
    assert config_dirs_in(["-cd", str(tmp_path), "a=1", f"--config-dir={tmp_path / 'b'}"]) == [
        str(tmp_path), str(tmp_path / "b")]


def test_version_and_env_name_what_runs():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"marl {version()}")
    env = cli("env")
    assert env.returncode == 0
    for key in ("marl:", "commit:", "torch:", "transformers:", "trl:", "cuda:", "bwrap:"):
        assert key in env.stdout
    assert cli("env", "extra").returncode == 2


def test_marl_train_starts_from_the_first_run_with_or_without_overrides(monkeypatch):
    started = []
    monkeypatch.setattr(train_cli, "run_app", lambda command, name, app, args, hint=None: started.append(args))
    for args in ([], ["seed=1"], ["--cfg", "job"], ["-m", "seed=1,2"], ["-m", "env=sudoku,math"]):
        train_cli.run(args)
        assert started[-1] == ["experiment=embedded", *args]
    train_cli.run(["env=sudoku"])  # another task family: its recipe (tests/cli/test_first_run.py)
    assert started[-1] == ["experiment=toy/table/sudoku_grpo", "env=sudoku"]
    train_cli.run(["experiment=toy/plan_path_grpo", "seed=1"])
    assert started[-1] == ["experiment=toy/plan_path_grpo", "seed=1"]
    train_cli.run(["experiment=null", "seed=1"])  # the opt-out: run_app makes it Hydra's `~experiment`
    assert started[-1] == ["experiment=null", "seed=1"]
    train_cli.run(["~experiment"])
    assert started[-1] == ["~experiment"]


def test_marl_eval_starts_from_the_first_run_unless_it_loads_a_run(monkeypatch):
    started = []
    monkeypatch.setattr(eval_cli, "run_app", lambda command, name, app, args, hint=None: started.append(args))
    eval_cli.run(["eval.samples=4"])
    assert started[-1] == ["experiment=embedded", "eval.samples=4"]
    for args in (["load=/runs/a"], ["experiment=null"], ["experiment=toy/plan_path_grpo"]):
        eval_cli.run(args)  # a loaded run keeps its own experiment (run_app adds its saved overrides)
        assert started[-1] == args


def test_a_sweep_job_dir_loads_with_its_own_overrides_quoted_or_not(tmp_path):
    """A sweep's job dirs hold ``=`` (``seed=1``), which Hydra's grammar refuses unquoted: marl quotes such paths, and
    reads the run's own overrides through the quotes (before, a quoted path silently evaluated the default config)."""
    job = tmp_path / "multirun" / "experiment=toy_plan_path_grpo,trainer.steps=3" / "seed=1"  # two swept keys
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- experiment=toy/plan_path_grpo\n- seed=1\n")
    other = tmp_path / "seed=2"
    assert quoted_paths([f"load={job}", f"trainer.resume={other},{tmp_path}", "seed=2"]) == [
        f"load='{job}'", f"trainer.resume='{other}',{tmp_path}", "seed=2"]  # a path, or a sweep's list of them
    for given in (f"load={job}", f"load='{job}'", f'load="{job}/checkpoints/step_000003"'):
        assert inherited_overrides(quoted_paths([given, "seed=2"])) == ["experiment=toy/plan_path_grpo"]
    evaluated = cli("eval", f"load={job}", "--cfg", "job")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "name: toy_plan_path_grpo" in evaluated.stdout and "seed: 1" in evaluated.stdout


def test_cfg_job_shows_what_marl_train_runs():
    bare, seeded = cli("train", "--cfg", "job"), cli("train", "seed=0", "--cfg", "job")
    assert bare.returncode == seeded.returncode == 0
    assert "name: embedded" in bare.stdout and bare.stdout == seeded.stdout
    for opt_out in ("experiment=null", "~experiment"):
        assert "name: default" in cli("train", opt_out, "--cfg", "job").stdout
    evaluated = cli("eval", "experiment=null", "--cfg", "job")  # Hydra 1.3 refuses `group=null`: every command
    assert evaluated.returncode == 0 and "name: default" in evaluated.stdout


def test_a_config_error_the_starting_recipe_causes_says_how_to_opt_out(monkeypatch):
    # a first run for sudoku (no env picked: it is used unchecked); a Plan-Path key fails on it, not on the bare
    # group defaults (Plan-Path)
    monkeypatch.setattr("marl_cli.cli.first_run.RECIPES", (Recipe("toy/table/sudoku_grpo", "sudoku"),))
    out = cli("train", "env.block_prob=0.3")
    error = out.stderr.strip().splitlines()[-1]  # after the line announcing the recipe
    assert out.returncode == 2 and error.startswith("marl train: error: env.block_prob is a setting of env=plan_path, "
                                                    "not of env=sudoku")
    assert error.endswith("(marl train started from experiment=toy/table/sudoku_grpo; add "
                                        "experiment=null to start from the bare group defaults)")
    typo = cli("train", "trainer.steps=x")  # fails without the recipe too: no hint
    assert typo.returncode == 2 and "add experiment=null" not in typo.stderr
    # an env's recipe that does not fit (it pins Plan-Path keys) gives way to the bare defaults, which do
    pinned = (Recipe("embedded", "plan_path"), Recipe("embedded", "sudoku"))
    monkeypatch.setattr("marl_cli.cli.first_run.RECIPES", pinned)
    assert recipe_for("train", ["env=sudoku"]) is None


def test_a_resume_continues_in_its_run_dir(monkeypatch):
    started = []
    monkeypatch.setattr(train_cli, "run_app", lambda command, name, app, args, hint=None: started.append(args))
    train_cli.run(["trainer.resume=/runs/a", "trainer.steps=9"])
    assert started[-1] == ["trainer.resume=/runs/a", "trainer.steps=9", "hydra.run.dir='/runs/a'"]
    train_cli.run(["trainer.resume='/sweep/a=1,b=2/seed=0'"])  # a sweep job's dir, quoted on the command line
    assert started[-1][-1] == "hydra.run.dir='/sweep/a=1,b=2/seed=0'"
    for given in (["hydra.run.dir=/elsewhere"], ["-m"]):  # the user's own run dir, or a sweep: left alone
        train_cli.run(["trainer.resume=/runs/a", *given])
        assert started[-1] == ["trainer.resume=/runs/a", *given]


@pytest.mark.parametrize("rank,printed", [("0", True), ("1", False)])
def test_a_job_prints_its_run_dir_first_on_rank_0_only(tmp_path, monkeypatch, capsys, rank, printed):
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["~experiment"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    HydraConfig.instance().set_config(cfg)
    monkeypatch.setenv("RANK", rank)
    assert run_job("train", lambda cfg, run_dir: {"eval/success": 0.5}, cfg) == 0.5
    out = capsys.readouterr().out.splitlines()
    assert out == ([f"run dir: {tmp_path / 'run'}"] if printed else [])


def test_a_launched_process_leaves_its_process_group_when_marl_returns(tmp_path, monkeypatch):
    import torch.distributed as dist

    from marl_cli.cli import app

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    monkeypatch.setattr(app, "check_overrides", lambda *a, **k: None)
    run_app("train", "train", lambda: None, ["trainer.steps=1"])
    assert not dist.is_initialized()
