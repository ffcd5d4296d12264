"""The kept records of one raw object, held columnar a Parquet row group at a time.

A whole object's rows as Python dicts cost ~1 GB for a 64 MiB JSONL object, so rows wait as
Python objects only a bounded batch at a time (``BATCH_ROWS`` rows or ``BATCH_CHARS`` characters
of text), then become Arrow arrays; the two large columns (``text`` and its ``payload`` JSON) go
straight into one UTF-8 buffer each, so they are never held twice (no chunks to concatenate).
With a sink, each row group of the records Parquet goes to it as soon as it is full, so an object
is never held whole, whatever its size: a group is full at ``ROW_GROUP_ROWS`` kept rows or at the
row whose ``text`` and ``payload`` bring the group's UTF-8 bytes to ``GROUP_BYTES``, a rule on rows
alone, so the batch bounds move no group boundary (no byte). Holding the whole object had cost
~290 MB for a 64 MB object of 206k short records, and grew with the object (a 1 GB object of long
documents was held whole). Each group is one contiguous array per column, written in one call.
"""

import sys
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from itertools import accumulate, islice
from typing import Any

import pyarrow as pa

from corpus_assets.core.records.canonicalize import Excluded, Stages, contaminated, finish_records
from corpus_assets.core.records.index import EXCLUSION_COLUMNS, RECORD_COLUMNS
from corpus_assets.core.storage.parquet_sink import ROW_GROUP_ROWS

# A batch of kept rows waits as Python objects until either bound: rows, or characters of text
# (the payload JSON holds about as many again), so a few long documents are no bigger a batch.
BATCH_ROWS = 4096
BATCH_CHARS = 1 << 20
GROUP_BYTES = 32 << 20  # UTF-8 bytes of text and payload in one row group (with a sink)
LARGE = {"payload": "payload", "text": "text_utf8"}  # column -> record key of its UTF-8 bytes
_SMALL = pa.schema([f for f in RECORD_COLUMNS if f.name not in LARGE])
_MAX_OFFSET = (1 << 31) - 1  # a ``string`` array's int32 offsets


def exclude(table: dict[str, list[Any]], digest: str, line: int, why: Excluded) -> None:
    """Append one exclusion row (location and reason only) to ``table``'s columns."""
    for key, value in (
        ("object", digest),
        ("line", line),
        ("reason", why.reason),
        ("detail", why.detail),
    ):
        table[key].append(value)


class ExclusionRows:
    """An object's exclusion rows (location and reason only), as columns of Python values. With
    a sink each row group (``ROW_GROUP_ROWS`` rows, one contiguous array per column: the slice
    ``pq.write_table`` of the whole table writes) goes to it as it fills, so an object of
    millions of malformed lines is not held whole (3M such lines held 1.2 GB); without one they
    are held for :meth:`table`."""

    def __init__(self, digest: str, sink: Callable[[pa.Table], None] | None = None) -> None:
        self.digest, self.sink = digest, sink
        self.columns: dict[str, list[Any]] = {f.name: [] for f in EXCLUSION_COLUMNS}

    def add(self, line: int, why: Excluded) -> None:
        exclude(self.columns, self.digest, line, why)
        self._maybe_full()

    def extend(self, columns: dict[str, list[Any]]) -> None:
        """Rows given as columns (the contaminated records', after every other exclusion)."""
        for row in zip(*(columns[f.name] for f in EXCLUSION_COLUMNS), strict=True):
            for name, value in zip(self.columns, row, strict=True):
                self.columns[name].append(value)
            self._maybe_full()

    def _maybe_full(self) -> None:
        if self.sink is not None and len(self.columns["line"]) == ROW_GROUP_ROWS:
            self.sink(self.table())

    def table(self) -> pa.Table:
        """The rows held (all of them without a sink); held no more afterwards."""
        columns, self.columns = self.columns, {name: [] for name in self.columns}
        return pa.Table.from_pydict(columns, schema=EXCLUSION_COLUMNS)

    def finish(self) -> None:
        """The last rows to the sink (none when the last group was full)."""
        if self.sink is not None and self.columns["line"]:
            self.sink(self.table())


class Utf8Column:
    """A non-null ``string`` column appended one value at a time into one buffer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.data = bytearray()
        self.offsets = array("i", [0])

    def extend(self, encoded: list[bytes]) -> None:
        """Append values already encoded as UTF-8 (the record path encodes each once)."""
        end = len(self.data)
        self.data += b"".join(encoded)
        if len(self.data) > _MAX_OFFSET:
            raise ValueError(f"column {self.name!r} of one object exceeds 2 GiB")
        self.offsets.extend(islice(accumulate(map(len, encoded), initial=end), 1, None))

    def finish(self) -> pa.Array:
        """The array over the buffers themselves (no copy); the column is empty afterwards."""
        data, offsets = self.data, self.offsets
        self.data, self.offsets = bytearray(), array("i", [0])
        count = len(offsets) - 1
        return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))


class KeptRecords:
    """Kept records of one object (module docstring), screened for benchmark contamination a
    batch at a time: ``match_many`` judges each text alone, so the batch changes no verdict.
    Contamination exclusions are kept apart and written after every other exclusion, the order
    the whole-object screen had. ``sink``: takes each full row group (then :meth:`finish` the
    last); without one, the rows are held for :meth:`table`."""

    def __init__(
        self, digest: str, stages: Stages, sink: Callable[[pa.Table], None] | None = None
    ) -> None:
        self.digest, self.stages = digest, stages
        self.sink = sink
        self.group_rows = ROW_GROUP_ROWS if sink is not None else sys.maxsize
        self.group_bytes = GROUP_BYTES if sink is not None else sys.maxsize
        self.pending: list[dict[str, Any]] = []
        self.pending_chars = 0
        self.arrays: dict[str, list[pa.Array]] = {name: [] for name in _SMALL.names}
        self.large = {name: Utf8Column(name) for name in LARGE}
        self.held = 0  # rows of the group being filled
        self.contaminated: dict[str, list[Any]] = {f.name: [] for f in EXCLUSION_COLUMNS}
        self.reasons: Counter[str] = Counter()
        self.flagged: Counter[str] = Counter()  # records excluded per benchmark item id
        self.rows = self.chars = 0

    def add(self, record: dict[str, Any]) -> None:
        self.pending.append(record)
        self.pending_chars += len(record["text"])
        if len(self.pending) >= BATCH_ROWS or self.pending_chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        pending, self.pending, self.pending_chars = self.pending, [], 0
        hits = contaminated(self.stages.index, [r["text"] for r in pending])
        for n, (why, match) in sorted(hits.items()):
            self.reasons[why.reason] += 1
            self.flagged[match.item_id] += 1
            exclude(self.contaminated, self.digest, pending[n]["line"], why)
        if hits:
            pending = [record for n, record in enumerate(pending) if n not in hits]
        finish_records(pending)
        while pending:  # a batch may fill the group and start the next
            room = self._room(pending)
            self._append(pending[:room])
            pending = pending[room:]
            if self._full() and self.sink is not None:
                self.sink(self._group())

    def _held_bytes(self) -> int:
        return sum(len(column.data) for column in self.large.values())

    def _full(self) -> bool:
        return self.held == self.group_rows or self._held_bytes() >= self.group_bytes

    def _room(self, pending: list[dict[str, Any]]) -> int:
        """How many of ``pending`` the group takes: up to its row bound, and up to the row
        that brings its bytes to the byte bound (that row included)."""
        rows = pending[: self.group_rows - self.held]
        sizes = accumulate(len(r["text_utf8"]) + len(r["payload"]) for r in rows)
        return min(len(rows), bisect_left(list(sizes), self.group_bytes - self._held_bytes()) + 1)

    def _append(self, pending: list[dict[str, Any]]) -> None:
        """Rows onto the group being filled, as Arrow arrays."""
        # a comprehension per column: ~3x faster than appending row by row to every column
        columns = {name: [record[name] for record in pending] for name in self.arrays}
        self.chars += sum(len(text) for text in (record["text"] for record in pending))
        for key, large in self.large.items():
            large.extend([record[LARGE[key]] for record in pending])
        for record in pending:  # copied: a caller's reference to a record keeps no text
            record["text"] = record["text_utf8"] = record["payload"] = None
        batch = pa.RecordBatch.from_pydict(columns, schema=_SMALL)
        self.rows += batch.num_rows
        self.held += batch.num_rows
        for name, values in zip(_SMALL.names, batch.columns, strict=True):
            self.arrays[name].append(values)

    def _group(self) -> pa.Table:
        """The group being filled, one contiguous array per column; the group is empty after."""
        columns = []
        for field in RECORD_COLUMNS:
            if field.name in self.large:
                columns.append(self.large[field.name].finish())
                continue
            chunks, self.arrays[field.name] = self.arrays[field.name], []
            chunks = chunks or [pa.array([], field.type)]  # no row kept: an empty column
            columns.append(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
            del chunks
        self.held = 0
        return pa.Table.from_arrays(columns, schema=RECORD_COLUMNS)

    def finish(self) -> None:
        """The last rows to the sink (nothing when every group was full or no row was kept)."""
        self.flush()
        if self.held and self.sink is not None:
            self.sink(self._group())

    def table(self) -> pa.Table:
        """Every kept record, one contiguous array per column (without a sink)."""
        self.flush()
        return self._group()
