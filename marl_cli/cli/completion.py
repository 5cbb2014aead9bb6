"""``marl completion bash``: tab completion for ``marl``'s commands and, through Hydra's own completion,
for ``marl train``/``marl eval`` groups, options and keys.

    eval "$(marl completion bash)"      # in ~/.bashrc (zsh: autoload bashcompinit && bashcompinit first)
"""

from __future__ import annotations

import sys

BASH = r"""_marl() {
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "COMMANDS --help --version" -- "${COMP_WORDS[1]}"))
        return
    fi
    case "${COMP_WORDS[1]}" in
        train|eval)
            # Hydra completes a program named by the line's first word: "marl train" becomes "marl-train"
            # (same length, so COMP_POINT still points where the cursor is)
            COMPREPLY=($(COMP_POINT=$COMP_POINT COMP_LINE="marl-${COMP_LINE#marl }" \
                marl "${COMP_WORDS[1]}" -sc query=bash 2>/dev/null)) ;;
        *) COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}")) ;;
    esac
}
complete -o nospace -o default -F _marl marl
"""


def script() -> str:
    from marl_cli.cli.main import COMMANDS

    return BASH.replace("COMMANDS", " ".join(COMMANDS))


def run(args: list[str]) -> None:
    if args != ["bash"]:
        print("marl completion: error: usage: marl completion bash  (then: eval \"$(marl completion bash)\")",
              file=sys.stderr)
        sys.exit(2)
    print(script(), end="")
