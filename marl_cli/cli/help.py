"""``marl train --help`` / ``marl eval --help``: what each config group is for and its options (the files
under ``conf/``, without the schema entries Hydra would also list), the runnable experiments, and the
commands to see more; ``--help <group>`` prints that group's part of the generated config reference."""

from __future__ import annotations

import html
from pathlib import Path

from marl_cli.config.paths import config_dir

GROUPS = {
    "env": "the task family",
    "workflow": "the agents and their turn order",
    "algorithm": "how advantages are computed (GRPO, AT-GRPO, M-GRPO; PPO, MARFT, ArCHer with a critic)",
    "credit": "credit beyond the algorithm's: per token (HICRA) or per turn (IGPO)",
    "critic": "the learned value model the value-based algorithms read: none, token (PPO) or utterance (MARFT, ArCHer)",
    "reward": "rewards from a model: none (the env's program), a judge LM, or an OpenAI-compatible judge server",
    "policy": "which model acts for which role (one shared, one per role, a LoRA adapter per role)",
    "model": "the model every policy starts from (the local tiny model, or a hub/local one)",
    "rollout": "the generation backend (transformers generate, or vLLM)",
    "trainer": "the update: learning rate, loss, mini-batches, warm start, checkpoints",
    "logger": "where metrics go besides metrics.jsonl",
    "store": "the decoupled M-GRPO trainers' exchange",
    "dry_run": "swap in the tiny model (and embedded data) to check a paper experiment on a CPU",
    "hparams_search": "an Optuna search (with -m)",
    "hydra/launcher": "where -m jobs run: side by side on this machine, or on SLURM",
}


def options(group: str, root: Path) -> list[str]:
    """The options of ``group``: its yaml files, without the ``base_*`` schemas."""
    return sorted(p.stem for p in (root / group).glob("*.yaml") if not p.stem.startswith("base_"))


BUILDING_BLOCK = "# marl: building-block"
"""The header line of an experiment file that other experiments include and that is no run of its own."""


def is_building_block(path: Path) -> bool:
    """Whether ``path``'s leading comment lines mark it as a building block (``# marl: building-block``)."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            return False
        if line.startswith(BUILDING_BLOCK):
            return True
    return False


def runnable_experiments(root: Path) -> list[Path]:
    """The experiment files ``experiment=<path>`` runs: every one but the building blocks."""
    return sorted(p for p in (root / "experiment").rglob("*.yaml") if not is_building_block(p))


def experiments(root: Path) -> list[str]:
    """One line per kind of experiment dir: dirs holding the same runnable files are folded into one, their
    differing path parts written as ``{a,b}`` (the paper table: ``paper/at_grpo/{models}/{benchmarks}/``)."""
    base = root / "experiment"
    runnable = runnable_experiments(root)
    by_files: dict[tuple[int, tuple[str, ...]], list[tuple[str, ...]]] = {}
    for folder in sorted({p.parent for p in runnable}):
        names = tuple(sorted(p.stem for p in runnable if p.parent == folder))
        parts = folder.relative_to(base).parts
        by_files.setdefault((len(parts), names), []).append(parts)
    lines = []
    for (_, names), folders in sorted(by_files.items(), key=lambda item: item[1][0]):
        columns = [sorted(set(column)) for column in zip(*folders, strict=True)]
        prefix = "/".join(c[0] if len(c) == 1 else "{" + ",".join(c) + "}" for c in columns)
        lines.append(f"{prefix + '/' if prefix else ''}{{{','.join(names)}}}" if len(names) > 1
                     else f"{prefix + '/' if prefix else ''}{names[0]}")
    return lines


def help_text(command: str, args: list[str] | None = None) -> str:
    """``marl <command> --help``; with a section name among ``args`` (``--help trainer``), that section of the
    config reference instead."""
    from marl_cli.config.reference import section_text, sections
    from marl_cli.plugins import load_builtin

    load_builtin()  # the options' schemas
    root = config_dir()
    wanted = [a for a in args or [] if not a.startswith("-") and "=" not in a]
    if wanted:
        if wanted[0] not in sections():
            return f"no reference section {wanted[0]!r}; choose from: {', '.join(sections())}"
        return html.unescape(section_text(wanted[0], root))
    lines = [f"usage: marl {command} [group=option ...] [key=value ...] [-m] [--cfg job]", "",
             "Config groups (group=option; the defaults are in conf/groups.yaml):"]
    for group, what in GROUPS.items():
        lines.append(f"  {group + ':':<16}{what}")
        lines.append(f"  {'':<16}{', '.join(options(group, root))}")
    lines += [f"  {'experiment:':<16}a whole run pinned in one file (# @package _global_)",
              *(f"  {'':<16}{entry}" for entry in experiments(root)), "",
              *(f"{f'marl {command} {args}':<33}{what}" for args, what in commands(command)),
              "docs/reference/config.md: the config reference (every group and key)"]
    return "\n".join(lines)


def commands(command: str) -> list[tuple[str, str]]:
    """The closing lines of ``marl <command> --help``: arguments and what they show."""
    out = [("--cfg job", "print the composed config (every key and its value)")]
    if command in ("train", "eval"):
        out.append(("experiment=null", f"the bare group defaults (marl {command} starts from experiment=embedded)"))
    return [*out, ("--help <group>", "every key of a group: type, default, bounds, help"),
            ("--hydra-help", "Hydra's own flags")]
