"""Write ``arithmetic.jsonl``: short arithmetic questions and answers from marl's own generator, the example
dataset of ``env=dataset`` (``python examples/datasets/make_arithmetic.py``; the file is shipped, this remakes it)."""

import json
from pathlib import Path

from marl_cli.envs.math_data import generate

rows, seen = [], set()
for seed in range(4000):
    task = generate(seed, max_operand=9, kinds=["arithmetic"], holdout=False)
    if task.question not in seen and "/" not in task.answer and len(rows) < 600:
        seen.add(task.question)
        rows.append({"question": task.question, "answer": task.answer})
out = Path(__file__).with_name("arithmetic.jsonl")
out.write_text("".join(json.dumps(row) + "\n" for row in rows))
print(f"{len(rows)} rows -> {out}")
