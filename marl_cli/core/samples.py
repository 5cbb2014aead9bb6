"""The sample table: one row per (task, branch, turn, agent) completion."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

TRAINER_COMPUTES = {"computed": True}
"""The mark (a field's metadata) of what the trainer that reads the rows computes itself (an estimator's output):
not part of what was played, so rows handed between processes (the decoupled store) leave it out (``COMPUTED``)."""


@dataclass
class Sample:
    """One agent's completion at one turn of one episode, with its reward.

    ``task`` indexes the task within the step, ``branch`` the sampled episode (or candidate) for it.
    ``segment`` numbers a role's separate trajectories within one episode (a sub-agent's invocations).
    What the trainer computes (``TRAINER_COMPUTES``, every algorithm alike): ``advantage``, filled in by the algorithm;
    ``keep``, cleared by its group filter; ``token_advantages``, when an algorithm or a post-processor (HICRA) gives
    credit token by token, one advantage per completion token, what the update uses (``advantage`` then stays the
    row's scalar, for statistics and samples.jsonl); ``estimates``, what a value-based algorithm's critic puts on
    the row and its estimator reads, under names the algorithm gives them (each value-based algorithm's module
    names its own).
    ``reference`` is the role's correct answer where the turn started (the env's oracle), when a credit method
    asked the rollout for it (IGPO scores how likely the policy is to give it).
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
    advantage: float = field(default=0.0, metadata=TRAINER_COMPUTES)
    keep: bool = field(default=True, metadata=TRAINER_COMPUTES)
    sampling_logprobs: list[float] = field(default_factory=list)
    prompt_truncated: bool = False
    finished: bool = True
    temperature: float | None = None
    token_advantages: list[float] = field(default_factory=list, metadata=TRAINER_COMPUTES)
    reference: str | None = None
    estimates: dict[str, Any] = field(default_factory=dict, metadata=TRAINER_COMPUTES)
    policy_version: int | None = None
    """The updates the weights that sampled the row had received (the trainer's steps; a decoupled sub row: the
    sub trainer's); a row trained after update s − 1 is s − 1 − ``policy_version`` updates old (its staleness)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A row pickled before the critic's numbers moved into ``estimates`` (a checkpoint's rows played ahead)."""
        moved = {key: state.pop(key) for key in LEGACY_ESTIMATES if key in state}
        state.setdefault("estimates", {k: v for k, v in moved.items() if v not in (None, [])})
        self.__dict__.update(state)

    def per_token(self) -> list[float]:
        """The advantage of each completion token: ``token_advantages`` where given, else ``advantage`` on all."""
        return list(self.token_advantages) if self.token_advantages else [self.advantage] * len(self.completion_ids)

    def trains(self) -> bool:
        """Some completion token has a non-zero advantage (with β = 0 a row without one has no gradient)."""
        return any(a != 0.0 for a in self.token_advantages) if self.token_advantages else self.advantage != 0.0


COMPUTED = tuple(f.name for f in fields(Sample) if f.metadata.get("computed"))
"""The fields the trainer that reads rows computes itself (``TRAINER_COMPUTES``)."""
LEGACY_ESTIMATES = ("values", "value", "q_value", "returns")
"""The critic's numbers a row held as fields of its own before they moved into ``Sample.estimates``."""
