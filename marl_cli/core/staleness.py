"""How old a row is: which weights step s is played from, and how many updates its rows trail the learner.

Step s is trained after update s − 1. With ``trainer.max_staleness=k`` its episodes may be played from the weights
after update v(s) = max(0, s − 1 − k) (the *policy version*, stamped on every row as ``Sample.policy_version``), so
a row trained at step s is s − 1 − v updates old (its *staleness*, at most k). One ``Staleness`` serves everything
that reads the bound or a row's age: the rollout worker (it waits for v(s) before playing step s), the decoupled
main trainer (it waits for the sub trainer's weights v(s)), the row sources (they stamp the rows), the loop's
``async/staleness_*`` metrics and ``samples.jsonl``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from marl_cli.core.samples import Sample


@dataclass(frozen=True)
class Staleness:
    """The bound on how many updates a row may trail the learner.

    Args:
        max_staleness: k, the ``trainer.max_staleness`` of the run (0: every step is played from the newest weights).
    """

    max_staleness: int = 0

    def version(self, step: int) -> int:
        """The oldest weights version (updates applied) step ``step`` may be played from: max(0, step − 1 − k)."""
        return max(0, step - 1 - self.max_staleness)

    @staticmethod
    def stamp(samples: Iterable[Sample], version: int) -> None:
        """Record on each row the weights version that played it."""
        for sample in samples:
            sample.policy_version = version

    @staticmethod
    def age(sample: Sample, step: int) -> int | None:
        """How many updates old ``sample`` is when trained at ``step`` (None: no version was recorded)."""
        return None if sample.policy_version is None else step - 1 - sample.policy_version

    @classmethod
    def metrics(cls, samples: Iterable[Sample], step: int) -> dict[str, float]:
        """The ages of the rows trained at ``step``: mean, max and the share of rows of each age
        (``async/staleness_<n>``); none where no row has a version."""
        ages = [age for age in (cls.age(s, step) for s in samples) if age is not None]
        if not ages:
            return {}
        metrics = {"async/staleness_mean": sum(ages) / len(ages), "async/staleness_max": float(max(ages))}
        metrics.update({f"async/staleness_{age}": ages.count(age) / len(ages) for age in sorted(set(ages))})
        return metrics
