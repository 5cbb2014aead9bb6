"""``marl completion bash|zsh``: tab completion for ``marl``: its commands, and for ``marl train``/``marl eval``
each group's options (``experiment=toy/`` one folder at a time; no ``base_*`` schema, no experiments' building
block) and the config's keys (through Hydra's own completion).

    eval "$(marl completion bash)"      # in ~/.bashrc
    eval "$(marl completion zsh)"       # in ~/.zshrc (after compinit)

Both scripts ask ``marl completion query '<the line up to the cursor>'``, which prints one candidate a line.
"""

from __future__ import annotations

import sys
from pathlib import Path

BASH = r"""_marl() {
    local line="${COMP_LINE:0:COMP_POINT}" cur prefix="" breaks="" IFS=$'\n'
    cur="${line##*[[:space:]]}"
    # readline replaces only what follows the last word-break character in the word (= and : by default)
    [[ $COMP_WORDBREAKS == *=* ]] && breaks+="="
    [[ $COMP_WORDBREAKS == *:* ]] && breaks+=":"
    [[ -n $breaks ]] && prefix="${cur%"${cur##*[$breaks]}"}"
    COMPREPLY=($(marl completion query "$line" 2>/dev/null))
    COMPREPLY=("${COMPREPLY[@]#"$prefix"}")
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} != *[=/] ]]; then compopt +o nospace 2>/dev/null; fi
}
complete -o nospace -o default -F _marl marl
"""

ZSH = r"""_marl() {
    local line="${(j: :)words[1,CURRENT-1]} $PREFIX"
    local -a found going ended
    found=("${(@f)$(marl completion query "$line" 2>/dev/null)}")
    found=(${found:#})
    if (( ! ${#found} )); then _files; return; fi
    going=(${(M)found:#*[=/]})  # a group= or a folder/: the word goes on
    ended=(${found:#*[=/]})
    compadd -S '' -- "${going[@]}"
    compadd -- "${ended[@]}"
}
if (( ! $+functions[compdef] )); then autoload -Uz compinit && compinit; fi
compdef _marl marl
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}
CONFIG_COMMANDS = ("train", "eval")
"""The commands whose arguments are config overrides (each the Hydra app over ``conf/<command>.yaml``)."""


def script(shell: str = "bash") -> str:
    return SCRIPTS[shell]


def query(line: str) -> list[str]:
    """The completions of the last word of ``line`` (a ``marl`` command line up to the cursor; after a space, of
    a new word), each a whole word."""
    words = line.split()
    current = "" if not line or line[-1].isspace() else words.pop()
    args = words[1:]
    if not args:
        from marl_cli.cli.main import COMMANDS

        return [c for c in [*COMMANDS, "--help", "--version"] if c.startswith(current)]
    if args[0] == "completion" and len(args) == 1:
        return [s for s in SCRIPTS if s.startswith(current)]
    if args[0] not in CONFIG_COMMANDS or current.startswith("-"):
        return []  # the shell completes file names
    return override_words(args[0], args[1:], current)


def override_words(command: str, before: list[str], current: str) -> list[str]:
    """Completions of ``current``, an override of ``marl <command>`` after the arguments ``before``: a group's
    options from the config dirs (marl's ``conf/`` and ``--config-dir``), else Hydra's completion of config keys."""
    from marl_cli.cli.help import is_building_block
    from marl_cli.config.paths import config_dir, config_dirs_in

    sign = current[:1] if current[:1] in "+~" else ""
    key, eq, value = current[len(sign):].partition("=")
    roots = [config_dir(), *map(Path, config_dirs_in(before))]
    if eq and not key.startswith("hydra/") and any((root / key).is_dir() for root in roots):
        folder = value.rpartition("/")[0] + "/" if "/" in value else ""
        entries = [p for root in roots if (root / key / folder).is_dir() for p in (root / key / folder).iterdir()]
        names = {f"{folder}{p.name}/" if p.is_dir() else f"{folder}{p.stem}" for p in entries
                 if (p.is_dir() or (p.suffix == ".yaml" and not is_building_block(p)))
                 and not p.name.startswith(("base_", ".", "_"))}
        return sorted(f"{sign}{key}={n}" for n in names if n.startswith(value))
    words = [w for w in hydra_words(command, before, current) if "=base_" not in w and "/base_" not in w]
    return [f"{w}=" if w[:1] != "~" and any(any((root / w.lstrip("+")).glob("*.yaml")) for root in roots) else w
            for w in words]  # a group with options (and folders, as experiment): Hydra leaves out its "="


def hydra_words(command: str, before: list[str], current: str) -> list[str]:
    """Hydra's completions of ``current`` (config keys, ``group=``), with marl's schemas and plug-ins registered."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.plugins.completion_plugin import DefaultCompletionPlugin

    from marl_cli.config.paths import config_dir, config_dirs_in
    from marl_cli.plugins import register_configs

    register_configs()
    search_path = create_config_search_path(str(config_dir()))
    for folder in config_dirs_in(before):
        search_path.append("command-line", f"file://{folder}")
    line = "".join(f"{w} " for w in before) + current
    try:
        return DefaultCompletionPlugin(ConfigLoaderImpl(config_search_path=search_path))._query(command, line)
    except Exception:  # a line that does not compose yet completes nothing rather than printing a traceback
        return []


USAGE = "usage: marl completion bash|zsh  (then, in ~/.bashrc or ~/.zshrc: eval \"$(marl completion bash)\")"


def run(args: list[str]) -> None:
    if args[:1] == ["query"] and len(args) <= 2:
        print("\n".join(query(args[1] if len(args) == 2 else "")))
    elif len(args) == 1 and args[0] in SCRIPTS:
        print(script(args[0]), end="")
    else:
        print(f"marl completion: error: {USAGE}", file=sys.stderr)
        sys.exit(2)
