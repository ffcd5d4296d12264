"""packing.samples._lookup against the left join on record id it replaced: same rows and count."""

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.training_view.packing.samples import _lookup


def _joined(samples: list, record_ids: list) -> tuple[list, int]:
    """The replaced code's answer: a left outer join of the samples on record id."""
    order = pa.table(
        {"record_id": pa.array(samples, pa.string()), "sample": np.arange(len(samples))}
    )
    rows = pa.table(
        {"record_id": pa.array(record_ids, pa.string()), "row": np.arange(len(record_ids))}
    )
    found = order.join(rows, "record_id", join_type="left outer").sort_by("sample")
    rows_of = [r if r is not None else -1 for r in found.column("row").to_pylist()]
    return rows_of, found.num_rows


@pytest.mark.parametrize(
    ("samples", "record_ids"),
    [
        (["a", "b", "a", "c"], ["c", "a", "b"]),  # repeats of a sample, every one found
        (["a", "x", None], ["a", "b"]),  # missing ones (and a null) are -1
        (["a", "b"], ["b", "a", "b"]),  # a record id on two rows counts twice
        ([], ["a"]),
        (["a"], []),
    ],
)
def test_lookup_is_the_left_join(samples: list, record_ids: list) -> None:
    got_rows, got_count = _lookup(
        pa.chunked_array([pa.array(samples, pa.string())]), pa.array(record_ids, pa.string())
    )
    want_rows, want_count = _joined(samples, record_ids)
    assert got_count == want_count
    if got_count == len(samples):  # no repeated record id: the rows are the join's
        assert got_rows.tolist() == want_rows
