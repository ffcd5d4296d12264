"""packing.samples._lookup against the left join on record id it replaced: same rows and count;
``located_from`` takes no places but each sample's exactly once."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.training_view.packing.samples import _lookup, located_from


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


@pytest.mark.parametrize("pos", [[0, 1, 1], [0, 2], [0, 1, 2, 2]])
def test_places_not_found_exactly_once_are_no_lookup(tmp_path: Path, pos: list[int]) -> None:
    """A sample found twice or never: ``located_from`` gives None (the partitioned lookup then
    names it) and leaves no folder in the home's ``tmp``."""
    samples = tmp_path / "samples.parquet"
    pq.write_table(pa.table({"record_id": ["a", "b", "c"]}), samples)
    n = len(pos)
    places = pa.record_batch(
        {"pos": pos, "chunk": [0] * n, "row": list(range(n)), "kind": pa.array([0] * n, pa.int8())}
    )
    home = SimpleNamespace(home=tmp_path / "home")
    assert located_from(home, None, samples, 3, [places]) is None  # type: ignore[arg-type]
    assert list((tmp_path / "home" / "tmp").iterdir()) == []
