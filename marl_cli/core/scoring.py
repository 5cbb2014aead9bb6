"""Teacher-forced log-probabilities of completions after their prompts under a model, without gradient: what a
credit method scores (IGPO's reference answers) and what a game's induced policy reads (each legal move)."""

from __future__ import annotations

from typing import Any


def completion_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]], pad: int,
                        batch_size: int) -> list[list[float]]:
    """log π(token | prompt, earlier tokens) of every token of each completion, in batches of ``batch_size``
    (prompts padded on the left, completions on the right; the model's dtype raised to at least float32)."""
    import torch

    from marl_cli.core.padding import pad_rows

    training, device = model.training, next(model.parameters()).device
    model.eval()
    out: list[list[float]] = []
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            prompt, prompt_mask = pad_rows(prompts[i:i + batch_size], pad, left=True)
            answer, answer_mask = pad_rows(completions[i:i + batch_size], pad, left=False)
            ids, mask = torch.cat([prompt, answer], 1).to(device), torch.cat([prompt_mask, answer_mask], 1).to(device)
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           logits_to_keep=answer.size(1) + 1).logits[:, :-1]
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 up, float64 kept
            logps = torch.log_softmax(logits, -1).gather(-1, answer.to(device).unsqueeze(-1)).squeeze(-1)
            out += [row[:n].tolist() for row, n in zip(logps.cpu(), answer_mask.sum(1).tolist(), strict=True)]
    model.train(training)
    return out
