"""The policy a team of models induces on a game: at each position, every legal move's probability, read from the
model's own log-probabilities of answering with it.

π(move | position) = exp(Σ log π(tokens of the answer "<marker> move" and its end token | prompt)) normalised
over the position's legal moves: the model's choice when it answers at once (a model that reasons before its
answer is read as if it answered directly). The prompt is the one the seat's role sees in play
(``Workflow.prompt``, its sampling's chat template and system message), scored by the policy routed to that
role; a seat a bot fills plays its bot's distribution (``random``: uniform, ``first_legal``: the first move).
``OpenSpielEnv.nash_conv`` turns these probabilities into the exact NashConv (``eval/nash_conv``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from marl_cli.core.scoring import completion_logprobs
from marl_cli.policies.scripted import is_scripted
from marl_cli.rollout.engine import Rollout
from marl_cli.rollout.generation import encode_prompts
from marl_cli.workflows.base import TeamState

BATCH = 16


def move_probabilities(rollout: Rollout, positions: list[Any]) -> list[dict[str, float]]:
    """Each position's probability of each legal move under the policy (or bot) that acts for its seat."""
    workflow, env = rollout.workflow, rollout.workflow.env
    out: list[dict[str, float]] = [{} for _ in positions]
    by_role: dict[str, list[int]] = defaultdict(list)
    for i, position in enumerate(positions):
        by_role[workflow.roles[env.seat(position)]].append(i)
    for role, indices in by_role.items():
        name = rollout.routing[role]
        for i, probs in zip(indices, _role_probabilities(rollout, role, name, [positions[i] for i in indices]),
                            strict=True):
            out[i] = probs
    return out


def _role_probabilities(rollout: Rollout, role: str, name: str, positions: list[Any]) -> list[dict[str, float]]:
    env, workflow = rollout.workflow.env, rollout.workflow
    moves = [env.legal_moves(p) for p in positions]
    if is_scripted(name):
        bot = name.split(":", 1)[1]
        if bot == "random":
            return [{m: 1 / len(ms) for m in ms} for ms in moves]
        if bot == "first_legal":
            return [{m: float(j == 0) for j, m in enumerate(ms)} for ms in moves]
        raise ValueError(f"a seat played by {bot} has no move probabilities to read (random and first_legal do)")
    policy = rollout.policies[name]
    tokenizer = policy.tokenizer
    prompts, _ = encode_prompts(policy, [workflow.prompt(role, TeamState(p)) for p in positions],
                                rollout.sampling.for_role(role))
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pairs = [(prompt, tokenizer(workflow.format_answer(m), add_special_tokens=False).input_ids + end)
             for prompt, ms in zip(prompts, moves, strict=True) for m in ms]
    policy.activate()
    logps = completion_logprobs(policy.model, [p for p, _ in pairs], [c for _, c in pairs],
                                tokenizer.pad_token_id, BATCH)
    totals = iter(sum(lp) for lp in logps)
    out = []
    for ms in moves:
        scores = [next(totals) for _ in ms]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        out.append({m: w / sum(weights) for m, w in zip(ms, weights, strict=True)})
    return out


def induced_nash_conv(rollout: Rollout, kind: int = 0) -> float:
    """The exact NashConv of the policy the rollout's models (and bots) induce on its game (``kind``: which game of
    a mixture)."""
    return rollout.workflow.env.nash_conv(lambda positions: move_probabilities(rollout, positions), kind)
