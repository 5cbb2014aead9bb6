"""The sample table: one row per (task, branch, turn, agent) completion."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    """One agent's completion at one turn of one episode, with its reward.

    ``task`` indexes the task within the step, ``branch`` the sampled episode (or candidate) for it.
    ``segment`` numbers a role's separate trajectories within one episode (a sub-agent's invocations).
    ``advantage`` is filled in by an algorithm; ``keep`` is cleared by its group filter.
    ``sampling_logprobs`` are the sampler's log-probs of the completion tokens (the log-prob gap is
    measured against them); ``prompt_truncated`` and ``finished`` (ended with an end token) come
    from the generator too.
    """

    task: int
    branch: int
    turn: int
    role: str
    policy: str
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    success: bool = False
    format_ok: bool = True
    info: dict[str, float] = field(default_factory=dict)
    segment: int = 0
    advantage: float = 0.0
    keep: bool = True
    sampling_logprobs: list[float] = field(default_factory=list)
    prompt_truncated: bool = False
    finished: bool = True


def pad_rows(rows: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one padded (ids, attention mask) pair: padded on the left (prompts) or the right."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask
