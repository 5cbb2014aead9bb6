"""The one staleness rule: which weights step s may be played from, and how old a row is when trained."""

from marl_cli.core.samples import Sample
from marl_cli.core.staleness import Staleness


def _row(version: int | None) -> Sample:
    return Sample(0, 0, 0, "a", "p", [1], [2], 0.0, policy_version=version)


def test_step_s_is_played_from_the_weights_after_update_s_minus_1_minus_k():
    assert [Staleness(0).version(s) for s in range(1, 6)] == [0, 1, 2, 3, 4]  # synchronous
    assert [Staleness(2).version(s) for s in range(1, 7)] == [0, 0, 0, 1, 2, 3]


def test_a_rows_age_is_the_updates_between_its_weights_and_the_update_that_trains_it():
    rows = [_row(None), _row(None)]
    Staleness.stamp(rows, 3)
    assert [r.policy_version for r in rows] == [3, 3]
    assert Staleness.age(rows[0], 5) == 1 and Staleness.age(_row(None), 5) is None
    assert all(Staleness.age(_row(Staleness(k).version(s)), s) == min(k, s - 1) for k in (0, 1, 3) for s in (1, 2, 9))


def test_staleness_metrics_count_the_updates_between_sampling_and_training():
    rows = [_row(v) for v in [3, 3, 2, 4]]
    assert Staleness.metrics(rows, 5) == {"async/staleness_mean": 1.0, "async/staleness_max": 2.0,
                                          "async/staleness_0": 0.25, "async/staleness_1": 0.5,
                                          "async/staleness_2": 0.25}
    assert Staleness.metrics([_row(None)], 5) == {}  # no version: no figure
