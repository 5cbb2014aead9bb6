"""Token rows as padded tensors: what the generator and the learner feed the model."""

from __future__ import annotations

import torch


def pad_rows(rows: list[list[int]], pad_id: int, left: bool, width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one padded (ids, attention mask) pair: padded on the left (prompts) or the right, to the
    longest row or ``width``, whichever is wider."""
    width = max(width, *(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask
