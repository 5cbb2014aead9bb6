"""Tab completion: the query both shell scripts ask, and each script in its own shell (bash always; zsh where it
is installed), with the real ``marl`` answering."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marl_cli.cli.completion import query
from tests.helpers import cli

BIN = str(Path(sys.executable).parent)
EXAMPLE_CONF = Path(__file__).resolve().parents[2] / "examples" / "extending" / "conf"


def test_commands_and_shells():
    assert query("marl ") == ["train", "eval", "report", "env", "gpu-check", "completion", "--help", "--version"]
    assert query("marl t") == ["train"]
    assert query("marl completion ") == ["bash", "zsh"]
    assert query("marl report ") == []  # run dirs: the shell completes file names


def test_group_options_without_schemas_and_experiments_folder_by_folder():
    assert query("marl train env=") == [f"env={e}" for e in (
        "code", "dataset", "math", "openenv", "openspiel", "pettingzoo", "plan_path", "reasoning_gym", "research",
        "sokoban", "sudoku", "textarena", "verifiers")]
    assert query("marl train rollout=") == ["rollout=hf", "rollout=vllm"]
    assert query("marl train experiment=") == ["experiment=cory/", "experiment=embedded", "experiment=envs/",
                                              "experiment=hetero/", "experiment=paper/", "experiment=toy/"]
    assert query("marl train experiment=toy/tab") == ["experiment=toy/table/"]
    assert query("marl eval experiment=toy/table/plan_path_at") == [
        "experiment=toy/table/plan_path_at_grpo_per_role", "experiment=toy/table/plan_path_at_grpo_shared"]
    assert "experiment=paper/at_grpo/" in query("marl train experiment=paper/")
    table = query("marl train experiment=toy/table/")
    assert "experiment=toy/table/sudoku_grpo" in table and "experiment=toy/table/budget" not in table  # a part
    user = query(f"marl train -cd {EXAMPLE_CONF} env=re")  # the user's config dir beside marl's
    assert user == ["env=reasoning_gym", "env=research", "env=reverse"]


def test_keys_come_from_hydra_without_schema_names():
    assert query("marl train trainer.learning_r") == ["trainer.learning_rate="]
    assert query("marl train exp") == ["experiment="]
    assert query("marl train ~exp") == ["~experiment"]
    words = query("marl train seed=1 ")
    assert "env=" in words and "trainer." in words and not any("base_" in w for w in words)
    assert "hydra/launcher=basic" in query("marl train hydra/launcher=")  # Hydra's own groups: Hydra's options


def _shell(shell: str, probe: str) -> list[str]:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "SCRIPT": cli("completion", shell).stdout}
    out = subprocess.run([shell, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_bash_completes_after_the_equals_sign_readline_breaks_words_at():
    probe = ('eval "$SCRIPT"; complete -p marl; '
             't() { COMP_LINE="$1"; COMP_POINT=${#1}; COMPREPLY=(); _marl; echo "${COMPREPLY[*]}"; }; '
             't "marl train experiment=toy/tab"; t "marl train env=pl"; t "marl tr"')
    assert _shell("bash", probe) == ["complete -o default -o nospace -F _marl marl", "toy/table/", "plan_path",
                                     "train"]
    assert cli("train", "--shell-completion", "install=bash").stdout == cli("completion", "bash").stdout


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed: apt-get install zsh")
def test_zsh_adds_whole_words_and_ends_a_finished_one():
    probe = ('compdef() { echo "compdef $*"; }; _files() { echo files; }; '
             'compadd() { echo "compadd $*"; }; eval "$SCRIPT"; '
             'words=(marl train experiment=toy/tab); CURRENT=3; PREFIX=experiment=toy/tab; _marl; '
             'words=(marl train env=plan); CURRENT=3; PREFIX=env=plan; _marl; '
             'words=(marl report x); CURRENT=3; PREFIX=x; _marl')
    assert _shell("zsh", probe) == ["compdef _marl marl", "compadd -S  -- experiment=toy/table/", "compadd --",
                                    "compadd -S  --", "compadd -- env=plan_path", "files"]
