"""The sample table: one row per (task, branch, turn, agent) completion."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One agent's completion at one turn of one episode, with its reward.

    ``task`` indexes the task within the step, ``branch`` the sampled episode (or candidate) for it.
    ``segment`` numbers a role's separate trajectories within one episode (a sub-agent's invocations).
    ``advantage`` is filled in by an algorithm; ``keep`` is cleared by its group filter. ``token_advantages``, when
    an algorithm or a post-processor (HICRA) gives credit token by token, holds one advantage per completion token
    and is what the update uses (``advantage`` then stays the row's scalar, for statistics and samples.jsonl).
    ``reference`` is the role's correct answer where the turn started (the env's oracle), when a credit method
    asked the rollout for it (IGPO scores how likely the policy is to give it).
    A learned critic fills in ``values`` (V(s_t) before each completion token: critic=token) or ``value`` (V of
    the state the turn starts in) and ``q_value`` (Q of the completion in it: ArCHer) before the advantages; a
    value-based algorithm sets ``returns``, the critic's regression targets (one per token, or one per row).
    ``sampling_logprobs`` are the sampler's log-probs of the completion tokens (the log-prob gap is
    measured against them); ``prompt_truncated`` and ``finished`` (ended with an end token) come
    from the generator too; ``temperature`` is the one the row was sampled at (the learner scores it there).
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
    temperature: float | None = None
    token_advantages: list[float] = field(default_factory=list)
    reference: str | None = None
    values: list[float] = field(default_factory=list)
    value: float | None = None
    q_value: float | None = None
    returns: list[float] = field(default_factory=list)
    policy_version: int | None = None
    """The updates the weights that sampled the row had received (the trainer's steps; a decoupled sub row: the
    sub trainer's); a row trained after update s − 1 is s − 1 − ``policy_version`` updates old (its staleness)."""

    def per_token(self) -> list[float]:
        """The advantage of each completion token: ``token_advantages`` where given, else ``advantage`` on all."""
        return list(self.token_advantages) if self.token_advantages else [self.advantage] * len(self.completion_ids)

    def trains(self) -> bool:
        """Some completion token has a non-zero advantage (with β = 0 a row without one has no gradient)."""
        return any(a != 0.0 for a in self.token_advantages) if self.token_advantages else self.advantage != 0.0
