import subprocess

from marl_cli.cli import train as train_cli
from marl_cli.cli.app import config_dirs_in, overrides_in, remove_if_empty
from marl_cli.provenance import version
from tests.helpers import cli


def test_overrides_skip_flags_and_their_values():
    args = ["-m", "a=1", "--config-name", "train", "+b=2,3", "-cd", "/x", "~c"]
    assert overrides_in(args) == ["a=1", "+b=2,3", "~c"]


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


def test_plain_marl_train_runs_the_first_run_that_learns(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(train_cli, "run_app", lambda command, name, app, args: started.append(args))
    train_cli.run([])
    assert started == [["experiment=embedded"]]
    assert "no overrides given, running experiment=embedded" in capsys.readouterr().err
    train_cli.run(["env=sudoku"])
    assert started[-1] == ["env=sudoku"]


def test_bash_completion_hands_marl_train_lines_to_hydra_as_its_program(tmp_path):
    # a stand-in `marl` records what the completion function asks Hydra
    probe = ('marl() { echo "$1|$2 $3|$COMP_LINE|$COMP_POINT"; }; eval "$SCRIPT"; '
             'COMP_WORDS=(marl train env=pl); COMP_CWORD=2; COMP_LINE="marl train env=pl"; COMP_POINT=17; _marl; '
             'echo "${COMPREPLY[@]}"; COMP_WORDS=(marl e); COMP_CWORD=1; _marl; echo "${COMPREPLY[@]}"')
    env = {"SCRIPT": cli("completion", "bash").stdout, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "train|-sc query=bash|marl-train env=pl|17"
    assert lines[1] == "eval env"
    assert cli("train", "--shell-completion", "install=bash").stdout == cli("completion", "bash").stdout
