"""An object's kept records leave a row group at a time: a group is full at ``ROW_GROUP_ROWS``
rows or at the row whose text and payload bring it to ``GROUP_BYTES``, so no object is held
whole; the rule is on rows alone, so the batch bounds move no boundary."""

import pyarrow as pa
import pytest

from corpus_assets.core.records import kept
from corpus_assets.core.records.canonicalize import Excluded, Stages, canonical_record
from corpus_assets.core.records.quality import QualityPolicy
from corpus_assets.core.runtime.config import ObjectsSource

SOURCE = ObjectsSource(id="s", kind="objects", path=".")
# texts of uneven lengths, so the byte bound falls inside batches and between them
TEXTS = [f"Document {n} says " + "some words about rivers " * (1 + (n * 7) % 23) for n in range(40)]


def _records() -> list[dict]:
    stages = Stages("p", QualityPolicy(), None)
    records = []
    for n, text in enumerate(TEXTS):
        record = canonical_record(SOURCE, "o.jsonl", n + 1, {"id": f"r{n}", "text": text}, stages)
        record.update(source_id="s", object="d", line=n + 1, byte_offset=0, cdc_lsn=None)
        records.append(record)
    return records


def _stream(batch_rows: int) -> tuple[list[pa.Table], list[int]]:
    """The groups a sink got, and how many it had got after each record was added."""
    groups: list[pa.Table] = []
    records = kept.KeptRecords("d", Stages("p", QualityPolicy(), None), sink=groups.append)
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kept, "BATCH_ROWS", batch_rows)
        for record in _records():
            records.add(record)
            assert records.held <= kept.ROW_GROUP_ROWS  # never more than one group held
            seen.append(len(groups))
        records.finish()
    assert records.rows == len(TEXTS) == sum(g.num_rows for g in groups)
    return groups, seen


def _group_bytes(group: pa.Table) -> list[int]:
    sizes = zip(group.column("text").to_pylist(), group.column("payload").to_pylist(), strict=True)
    return [len(text.encode()) + len(payload.encode()) for text, payload in sizes]


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "ROW_GROUP_ROWS", 7)
    monkeypatch.setattr(kept, "GROUP_BYTES", 4000)


@pytest.mark.usefixtures("small_groups")
def test_full_groups_leave_while_the_object_is_read() -> None:
    groups, seen = _stream(batch_rows=1)
    assert len(groups) >= 4
    assert seen[len(TEXTS) // 2] >= 2  # groups left before the object's end, not at finish


@pytest.mark.usefixtures("small_groups")
def test_a_group_ends_at_the_row_that_fills_it() -> None:
    groups, _ = _stream(batch_rows=4096)
    for group in groups[:-1]:
        sizes = _group_bytes(group)
        by_rows = group.num_rows == kept.ROW_GROUP_ROWS and sum(sizes) < kept.GROUP_BYTES
        by_bytes = sum(sizes) >= kept.GROUP_BYTES > sum(sizes[:-1])
        assert by_rows or by_bytes, (group.num_rows, sizes)
    assert any(g.num_rows < kept.ROW_GROUP_ROWS for g in groups[:-1])  # the byte bound cut one
    assert groups[-1].num_rows <= kept.ROW_GROUP_ROWS


@pytest.mark.usefixtures("small_groups")
@pytest.mark.parametrize("batch_rows", [1, 3, 5])
def test_batch_bounds_move_no_group_boundary(batch_rows: int) -> None:
    whole, _ = _stream(batch_rows=4096)
    groups, _ = _stream(batch_rows=batch_rows)
    assert [g.num_rows for g in groups] == [g.num_rows for g in whole]
    assert pa.concat_tables(groups).equals(pa.concat_tables(whole))


def test_without_a_sink_the_rows_are_held_for_one_table() -> None:
    records = kept.KeptRecords("d", Stages("p", QualityPolicy(), None))
    for record in _records():
        records.add(record)
    table = records.table()
    streamed, _ = _stream(batch_rows=4096)
    assert table.equals(pa.concat_tables(streamed))
    assert all(column.num_chunks == 1 for column in table.columns)


def test_exclusions_leave_a_group_at_a_time(small_groups: None) -> None:
    """Exclusion rows too: full groups go while the object is read, the contaminated records'
    rows after every other, and the groups are the held table cut at the row bound."""
    groups: list[pa.Table] = []
    streamed, held = kept.ExclusionRows("d", sink=groups.append), kept.ExclusionRows("d")
    after = []
    for line in range(1, 17):
        for rows in (streamed, held):
            rows.add(line, Excluded("parse.invalid_json", f"line {line}"))
        after.append(len(groups))
    contaminated = {"object": ["d"] * 3, "line": [3, 5, 9], "reason": ["c"] * 3, "detail": [""] * 3}
    for rows in (streamed, held):
        rows.extend(contaminated)
    streamed.finish()
    assert after[8] == 1 and after[-1] == 2  # two groups of 7 left before the end
    assert [g.num_rows for g in groups] == [7, 7, 5]
    whole = held.table()
    assert pa.concat_tables(groups).equals(whole)
    assert whole.column("line").to_pylist()[-3:] == [3, 5, 9]


def test_an_object_with_no_kept_row() -> None:
    """Every row excluded: held, an empty table of the records' columns; streamed, no group
    (the writer then writes the one empty group an empty table has)."""
    table = kept.KeptRecords("d", Stages("p", QualityPolicy(), None)).table()
    assert table.num_rows == 0 and table.schema == kept.RECORD_COLUMNS
    groups: list[pa.Table] = []
    records = kept.KeptRecords("d", Stages("p", QualityPolicy(), None), sink=groups.append)
    records.finish()
    assert groups == [] and records.rows == 0
