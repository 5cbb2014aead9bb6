"""The sample table's row: what was played travels between processes, what the trainer computes does not."""

import copyreg
import io
import pickle

from marl_cli.core.samples import COMPUTED, Sample
from marl_cli.training.rows.decoupled import from_item, to_item


def _played() -> Sample:
    return Sample(0, 1, 2, "sub", "p", [1, 2], [3], 0.5, success=True, segment=1, sampling_logprobs=[-0.1],
                  policy_version=4)


def test_the_computed_fields_are_the_estimators_outputs():
    assert COMPUTED == ("advantage", "keep", "token_advantages", "estimates")


def test_a_row_crosses_the_store_without_what_the_reading_trainer_computes():
    row = _played()
    row.advantage, row.keep, row.token_advantages = 1.5, False, [1.5]
    row.estimates.update(value=0.3, returns=[1.0])
    item = to_item([row])
    assert not set(item["rows"][0]) & set(COMPUTED)
    assert from_item(item) == [_played()]


class _OldPickler(pickle.Pickler):
    """Pickles a row as marl did before ``Sample.estimates``: the critic's numbers as fields of their own."""

    def reducer_override(self, obj):
        if not isinstance(obj, Sample):
            return NotImplemented
        state = {k: v for k, v in vars(obj).items() if k != "estimates"}
        return copyreg.__newobj__, (Sample,), {**state, "values": [0.1], "value": None, "q_value": 0.7, "returns": []}


def test_a_row_pickled_with_the_critics_numbers_as_fields_loads_them_into_estimates():
    buffer = io.BytesIO()
    _OldPickler(buffer).dump([_played()])
    (loaded,) = pickle.loads(buffer.getvalue())
    assert loaded.estimates == {"values": [0.1], "q_value": 0.7}
    assert not {"values", "value", "q_value", "returns"} & set(vars(loaded))
    loaded.estimates.clear()
    assert loaded == _played()
