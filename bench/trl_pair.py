"""marl against raw TRL at equal work on this CPU (``marl_cli/gpu_check/pair.py`` says what is compared): 8 prompts
× 8 completions of exactly 32 tokens of the tiny model, one thread, the runs of the two sides interleaved. Writes a
JSON report with each side's median seconds per step (rollout and update apart) and marl's ratios.

Usage: ``python bench/trl_pair.py --pairs 3 --steps 4 --out bench/trl_pair.json`` (``make bench-trl``)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from marl_cli.gpu_check.pair import Work, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved marl/TRL run pairs")
    parser.add_argument("--steps", type=int, default=4, help="steps a run (the first is left out)")
    parser.add_argument("--out", default="bench/trl_pair.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Work(steps=args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        report = compare(work, ["threads=1"], args.pairs, Path(tmp))
    report = {"work": {"prompts": work.tasks, "generations": work.generations, "tokens": work.tokens, "threads": 1,
                       "pairs": args.pairs, "steps_per_run": args.steps}, **report}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
