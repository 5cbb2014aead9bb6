"""``marl``: dispatch to a subcommand; each subcommand is a Hydra app."""

from __future__ import annotations

import importlib
import sys

from marl_cli.determinism import prepare

COMMANDS = {
    "train": ("marl_cli.cli.train", "train agents with GRPO, AT-GRPO or M-GRPO (a Hydra app over conf/train.yaml)"),
    "eval": ("marl_cli.cli.eval", "evaluate a run, a checkpoint or a model on held-out tasks (conf/eval.yaml)"),
    "report": ("marl_cli.cli.report", "tabulate run dirs beside paper numbers (Markdown, CSV; --plot for curves)"),
    "env": ("marl_cli.cli.env", "print versions, devices and tools (paste it into a bug report)"),
    "gpu-check": ("marl_cli.cli.gpu_check", "tiny-model checks of every GPU path in one table (make gpu-check)"),
    "completion": ("marl_cli.cli.completion", "print tab completion: eval \"$(marl completion bash)\" (or zsh)"),
}

USAGE = "usage: marl <command> [hydra overrides and flags] | marl --version\n\ncommands:\n" + "\n".join(
    f"  {name:<11} {help_}" for name, (_, help_) in COMMANDS.items()
) + "\n\nRun `marl <command> --help` for a command's config groups and options."


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if args else 2)
    if args[0] == "--version":
        from marl_cli.provenance import git_sha, version

        sha = git_sha()
        print(f"marl {version()}" + (f" (git {sha})" if sha else ""))
        sys.exit(0)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"marl: error: unknown command {command!r}; choose from: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    if argv is None:  # the command line itself (not a caller's list): its environment is still ours to set
        prepare(rest)  # trainer.deterministic=true: before anything imports torch
    try:
        importlib.import_module(COMMANDS[command][0]).run(rest)
    except KeyboardInterrupt:  # a run stopped by SIGINT/SIGTERM has saved what it could and said so
        print(f"marl {command}: interrupted", file=sys.stderr)
        sys.exit(130)
