"""Completions a person can read: a sample of rows per agent as text, for ``samples.jsonl`` and a W&B table."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from marl_cli.core.samples import Sample
from marl_cli.core.staleness import Staleness

COLUMNS = ("step", "split", "role", "policy", "task", "branch", "turn", "reward", "advantage", "success",
           "format_ok", "finished", "prompt", "completion")


JUDGED = ("judge_score", "program_reward")
"""What a reward model put on a row (``rewards/base.py``): its score, and the reward the program had given."""


def completion_records(samples: list[Sample], tokenizers: dict[str, Any], step: int, split: str, per_agent: int,
                       rng: random.Random | None = None) -> list[dict[str, Any]]:
    """Rows of each role as readable records (prompt and completion decoded).

    With ``rng``: ``per_agent`` rows of each role drawn at random (training rows). Without it: every
    row of the first ``per_agent`` tasks, in order, so whole evaluation episodes read turn by turn. A row with
    per-token advantages or a critic's values also records them (``_credit``).
    """
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    records = []
    for role, rows in by_role.items():
        if rng is not None:
            chosen = rng.sample(rows, min(per_agent, len(rows)))
        else:
            chosen = [s for s in rows if s.task < per_agent]
        for s in chosen:
            tok = tokenizers[s.policy]
            records.append({
                "step": step, "split": split, "role": role, "policy": s.policy, "task": s.task, "branch": s.branch,
                "turn": s.turn, "reward": s.reward, "advantage": s.advantage, "success": s.success,
                "format_ok": s.format_ok, "finished": s.finished,
                "prompt": tok.decode(s.prompt_ids, skip_special_tokens=False),
                "completion": tok.decode(s.completion_ids, skip_special_tokens=False)})
            if s.policy_version is not None:  # the weights that sampled it, and (training rows) how many updates old
                records[-1]["policy_version"] = s.policy_version
                if rng is not None:
                    records[-1]["staleness"] = Staleness.age(s, step)
            records[-1].update(_credit(s))
            records[-1].update({k: s.info[k] for k in JUDGED if k in s.info})
    return records


def _credit(s: Sample) -> dict[str, Any]:
    """What a row's credit came from beyond its reward, where it has it: per-token advantages (HICRA, PPO) and what
    a value-based algorithm's critic put on it (``Sample.estimates``: values, Q values, the critic's targets)."""
    out: dict[str, Any] = {}
    for key, value in {"token_advantages": s.token_advantages, **s.estimates}.items():
        if isinstance(value, list) and value:
            out[key] = [round(a, 6) for a in value]
        elif isinstance(value, float | int):
            out[key] = round(value, 6)
    return out
