"""The records of one dedup run as DuckDB views, so no string column of the partition is held.

Dedup decides on integers (row numbers, codes of strings, lengths); only its output needs the
strings again. DuckDB reads the canonical chunk files straight from the CAS (each verified
first, unless unchanged on disk since it last hashed right), numbers their rows in index order
(``row``), codes the string columns from streamed external sorts, sorts the total order, and
joins the decisions back to the strings for the output tables, spilling under
``temp_directory`` when its ``memory_limit`` is reached. Python keeps a few integers per record.

Orderings match the Arrow ones they replace: strings compare as bytes (UTF-8, no collation),
nulls sort last, and ``row`` breaks every remaining tie the way a stable sort would.
"""

import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.order import code_dtype, ordered_by_key, sorted_by, source_ranks
from corpus_assets.core.records.index import RECORD_COLUMNS, ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.artifacts import BINARY, make_ref, put_bytes
from corpus_assets.core.storage.cas_queries import Spilling, sql_list, streamed, tightened
from corpus_assets.core.storage.memory import hand_back_duckdb, release_memory
from corpus_assets.core.storage.trust import StatTrust

_CARRIED_SQL = "record_id, source_id, object, line, group_id, dedup_key, kind"
MEMORY_LIMIT = "160MB"  # DuckDB's buffer pool; it spills to disk beyond this
# ... and for the clusters joins (no sort, unlike the edges query): what DuckDB uses grows with
# the partition up to its limit, so a lower one keeps the layer's peak flat; the joins spill.
SORT_LIMIT = "64MB"  # the coding sorts, on one thread
OUTPUT_MEMORY_LIMIT = "64MB"  # on one thread (two needed more than 96 MB at 677k records)


@dataclass
class Coded:
    """A string column as an integer code per row and the values the codes stand for."""

    codes: np.ndarray  # by row (``code_dtype``)
    values: list[str]  # values[code]; sorted, so codes follow byte order


@dataclass
class RecordCodes:
    """What dedup decides on, by row: integer codes of the string columns."""

    n: int
    record_id: Coded
    dedup_key: Coded
    group_id: Coded
    kind: Coded
    source_id: Coded

    def forget(self, *names: str) -> None:
        """Drop the codes of columns no later phase reads (4 bytes per record each), so they
        do not sit under the near-dedup and output peaks; emptied in place, as a caller that
        handed them in (carried codes) may still hold them."""
        for name in names:
            coded = getattr(self, name)
            coded.codes, coded.values = np.empty(0, dtype=np.int64), []


def few_dtype(values: int) -> type[np.signedinteger]:
    """Codes of a column of ``values`` distinct values (kinds, sources): one byte a row for
    a handful, held by row through near-dedup. Arithmetic on them widens first."""
    return np.int8 if values <= 127 else np.int16 if values <= 32767 else np.int32


class PartitionDb:
    """A DuckDB connection whose view ``recs`` holds row, the carried columns and kind, and
    whose table ``meta`` holds (row, length); over chunk files, the view ``texts`` holds (row,
    text_digest) for the verified pairs (:mod:`.pair_cache`)."""

    def __init__(self, tmp: Path | None, threads: int = 2) -> None:
        base = tmp if tmp is not None else Path(tempfile.gettempdir())
        self._duck = Spilling(
            base,
            MEMORY_LIMIT,
            threads,
            preserve_insertion_order=False,
            flush=("8MB", "32MB"),  # hand freed memory back after each task, not past 128/512 MB
        )
        self.con = self._duck.con
        self.threads = self.workers = max(1, threads)
        self.paths: list[str] = []  # the chunk files, in row order (none over an Arrow table)
        self.starts = np.zeros(0, dtype=np.int64)  # each file's first row

    @classmethod
    def from_chunks(
        cls,
        ws: Workspace,
        chunks: list[ChunkRecords],
        lengths: list[np.ndarray] | None = None,
        with_lengths: bool = True,
    ) -> "PartitionDb":
        """The canonical chunks' files, verified against their digests, read in place;
        ``lengths``: each chunk's text lengths when known (:func:`chunk_lengths`). Only the
        driver's total order reads them: without ``with_lengths`` (the runner's coding) no
        table of them is made."""
        db = cls(ws.home / "tmp", ws.config.execution.workers)
        try:
            db._attach(ws, chunks, lengths, with_lengths)
        except BaseException:
            db.close()  # its spill directory too
            raise
        return db

    def _attach(
        self,
        ws: Workspace,
        chunks: list[ChunkRecords],
        known: list[np.ndarray] | None,
        with_lengths: bool,
    ) -> None:
        """``known``: the chunks' lengths (None: counted here), loaded ``with_lengths``."""
        if not chunks:
            self._from_arrow(RECORD_COLUMNS.empty_table())
            return
        # re-hashed unless unchanged on disk since they last hashed right (a child's old chunks)
        StatTrust(ws.cas, ws.catalog).verify_all({c.records["digest"]: c.what for c in chunks})
        paths, starts, lengths, start = [], [], [], 0
        for n, chunk in enumerate(chunks):
            path = ws.cas.path(chunk.records["digest"])
            paths.append(str(path))
            starts.append(start)
            if with_lengths:
                lengths.append(text_lengths(path) if known is None else known[n])
                release_memory()
            start += chunk.count
        files = pa.table({"path": paths, "start": pa.array(starts, pa.int64())})
        self.con.register("chunk_files", files)
        self.paths, self.starts = paths, np.asarray(starts, dtype=np.int64)
        if with_lengths:
            self._load_lengths(np.arange(start, dtype=np.int64), np.concatenate(lengths))
        del lengths
        scan = f"read_parquet({sql_list(paths)}, filename = true, file_row_number = true)"
        self.con.execute(
            f"CREATE TEMP TABLE files AS SELECT * FROM chunk_files;"
            f"CREATE VIEW recs AS SELECT f.start + p.file_row_number AS row, {_CARRIED_SQL} "
            f"FROM {scan} p JOIN files f ON p.filename = f.path;"
            f"CREATE VIEW texts AS SELECT f.start + p.file_row_number AS row, text_digest "
            f"FROM {scan} p JOIN files f ON p.filename = f.path"
        )
        self.con.unregister("chunk_files")

    def _load_lengths(self, rows: np.ndarray, lengths: np.ndarray) -> None:
        self.con.register("lengths", pa.table({"row": rows, "length": lengths}))
        self.con.execute("CREATE TEMP TABLE meta AS SELECT * FROM lengths")
        self.con.unregister("lengths")

    @classmethod
    def from_table(cls, records: pa.Table) -> "PartitionDb":
        """An in-memory records table (with a text or a length column)."""
        db = cls(None, 1)
        db._from_arrow(records)
        return db

    def _from_arrow(self, records: pa.Table) -> None:
        if "length" in records.column_names:
            length = pc.cast(records.column("length"), pa.int64())
        else:
            length = pc.cast(pc.utf8_length(records.column("text")), pa.int64())
        columns = [c.strip() for c in _CARRIED_SQL.split(",")]
        table = records.select(columns).append_column(
            "row", pa.array(np.arange(records.num_rows, dtype=np.int64))
        )
        self.con.register("records_arrow", table.append_column("length", length))
        self.con.execute(
            "CREATE TEMP TABLE recs AS SELECT row, "
            f"{_CARRIED_SQL} FROM records_arrow;"
            "CREATE TEMP TABLE meta AS SELECT row, length FROM records_arrow"
        )
        self.con.unregister("records_arrow")

    def texts_of(self, rows: np.ndarray) -> str:
        """A relation (row, text_digest) like the view ``texts`` over only the chunk files that
        hold ``rows``: a near-dedup class is one source's records, so its lookups read that
        source's files, not every file once per class."""
        return self._files_of(rows, "text_digest", "texts")

    def recs_of(self, rows: np.ndarray) -> str:
        """A relation like the view ``recs`` over only the chunk files that hold ``rows``."""
        return self._files_of(rows, _CARRIED_SQL, "recs")

    def _files_of(self, rows: np.ndarray, columns: str, view: str) -> str:
        if not len(self.paths):
            return view
        held = np.unique(np.searchsorted(self.starts, rows, side="right") - 1)
        paths = [self.paths[int(i)] for i in held]
        if not paths:
            return f"(SELECT * FROM {view} WHERE false)"
        scan = f"read_parquet({sql_list(paths)}, filename = true, file_row_number = true)"
        return (
            f"(SELECT f.start + p.file_row_number AS row, {columns} "
            f"FROM {scan} p JOIN files f ON p.filename = f.path)"
        )

    def close(self) -> None:
        self._duck.close()  # its spill directory too
        release_memory()

    def limit(self, memory: str, threads: int) -> None:
        """DuckDB's buffer limit and thread count from here on."""
        self.threads = max(1, threads)
        self.con.execute(f"SET memory_limit = '{memory}'")
        self.con.execute(f"SET threads = {self.threads}")

    def flush(self) -> None:
        """Hand the pages DuckDB freed back to the system now, at the end of a phase: after the
        coding sorts of 677k records they were ~130 MB, growing with the partition and sitting
        under every later phase's peak (per-task flushes do not reach them)."""
        hand_back_duckdb(self.con)

    def __enter__(self) -> "PartitionDb":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def n(self) -> int:
        return int(self.con.execute("SELECT count(*) FROM meta").fetchall()[0][0])

    def codes(self, carried: tuple[Coded, Coded, Coded] | None = None) -> RecordCodes:
        """Codes by row; codes follow the byte order of the values (record and group ids' may
        skip numbers: :meth:`_coded_ids`). ``carried``: record id, dedup key and group id codes
        a child took from its parent (:mod:`.carried_codes`), not sorted again. (Lengths stay
        in DuckDB's ``meta``: only the total order reads them.)"""
        n = self.n
        if carried is None:
            with tightened(self.con, SORT_LIMIT):
                record_id, group_id = self._coded_ids(n)
                dedup_key = self._coded("dedup_key", n)
        else:
            record_id, dedup_key, group_id = carried
        kind, source_id = self._coded_few(("kind", "source_id"), n)
        codes = RecordCodes(n, record_id, dedup_key, group_id, kind=kind, source_id=source_id)
        self.flush()
        return codes

    def _coded(self, column: str, n: int) -> Coded:
        """Codes by one external sort streamed back (a window rank would hold the partition):
        a new code wherever the sorted value changes."""
        codes = np.zeros(n, dtype=code_dtype(n))
        values: list[str] = []
        keep_values = column in ("kind", "source_id")  # a handful; the others are never listed
        code, previous = -1, None
        sql = f"SELECT row, {column} AS v FROM recs ORDER BY v, row"
        for batch in self.batches(sql):
            if not len(batch):
                continue
            rows = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
            new = value_changes(batch.column(1), previous)
            codes[rows] = code + np.cumsum(new)
            if keep_values:
                values += batch.column(1).filter(pa.array(new)).to_pylist()
            code, previous = int(codes[rows[-1]]), batch.column(1).slice(len(batch) - 1)
        return Coded(codes, values)

    def _coded_ids(self, n: int) -> tuple[Coded, Coded]:
        """Codes of record ids and group ids by one external sort of both: most records are
        their own group (the group id is the record id), and those group ids are not sorted
        again. A code ranks a value among the values of both columns, so each column's codes
        follow its byte order (nulls last) and equal values share one, numbers skipped."""
        codes = np.zeros(n, dtype=code_dtype(2 * n))
        groups = np.full(n, -1, dtype=code_dtype(2 * n))  # -1: the record id's code
        code, previous = -1, None
        sql = (
            "SELECT row, record_id AS v, false AS g FROM recs UNION ALL "
            "SELECT row, group_id, true FROM recs WHERE group_id IS DISTINCT FROM record_id "
            "ORDER BY v"
        )
        for batch in self.batches(sql):
            if not len(batch):
                continue
            rows = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
            ranked = code + np.cumsum(value_changes(batch.column(1), previous))
            group = np.asarray(batch.column(2).to_numpy(zero_copy_only=False), dtype=bool)
            codes[rows[~group]], groups[rows[group]] = ranked[~group], ranked[group]
            code, previous = int(ranked[-1]), batch.column(1).slice(len(batch) - 1)
        own = groups < 0
        groups[own] = codes[own]
        return Coded(codes, []), Coded(groups, [])

    def _coded_few(self, columns: tuple[str, ...], n: int) -> list[Coded]:
        """Codes of columns of a handful of values each (kind, source) from one scan, the
        partition never sorted for them: each batch's values dictionary-encoded, then every
        code mapped onto the distinct values sorted as :meth:`_coded` sorts them (byte order,
        null last)."""
        seen: list[dict[str | None, int]] = [{} for _ in columns]
        first = [np.zeros(n, dtype=code_dtype(n)) for _ in columns]  # by first appearance
        for batch in self.batches(f"SELECT row, {', '.join(columns)} FROM recs"):
            rows = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
            for k in range(len(columns)):
                coded = pc.dictionary_encode(batch.column(k + 1), null_encoding="encode")
                ids = [seen[k].setdefault(v, len(seen[k])) for v in coded.dictionary.to_pylist()]
                local = coded.indices.to_numpy(zero_copy_only=False)
                first[k][rows] = np.asarray(ids, dtype=np.int64)[local] if ids else 0
        out = []
        for k in range(len(columns)):
            values = sorted(seen[k], key=lambda v: (v is None, v or ""))
            final = np.empty(max(len(values), 1), dtype=np.int64)
            final[[seen[k][v] for v in values]] = np.arange(len(values))
            out.append(Coded(final[first[k]].astype(few_dtype(len(values))), values))
        return out

    def total_order(
        self, source_order: dict[str, int], sources: Coded, rank: np.ndarray
    ) -> np.ndarray:
        """Rows in the stated total order: source rank, longer first, record id, object, line
        (nulls last, ``row`` breaking ties). Sorted on integers: ``rank`` (each row's rank
        by record id, object, line and row: :func:`.output_order.id_ranks`) stands for
        the last four keys, so no string is sorted again. The first two keys are written
        into one int64 key per row as the lengths stream (no length or source array beside
        it). Once only: the lengths are dropped after it."""
        ranks = source_ranks(source_order, sources.values).astype(np.int64)
        bounds = self.con.execute("SELECT min(length), max(length) FROM meta").fetchall()
        shortest, longest = bounds[0]
        span = int(longest or 0) + 2  # longer-first keys 0..longest, a missing length one past
        n, places = len(rank), len(ranks) + 1
        if (shortest or 0) < 0 or places * span * max(n, 1) >= 2**62:
            return self._lexsorted(ranks, sources, rank)
        key = np.empty(n, dtype=np.int64)
        for rows, length, missing in self._lengths():
            part = np.where(missing, span - 1, int(longest or 0) - length)
            if len(ranks):
                part += ranks[sources.codes[rows]] * span
            key[rows] = part
        self.drop_lengths()
        return ordered_by_key(key, rank)

    def _lengths(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Rows, text lengths (0 where missing) and whether missing, a batch at a time."""
        for batch in self.batches("SELECT row, length FROM meta"):
            rows = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
            length = batch.column(1)
            missing = np.asarray(length.is_null().to_numpy(zero_copy_only=False))
            yield rows, np.asarray(pc.fill_null(length, 0).to_numpy(), dtype=np.int64), missing

    def drop_lengths(self) -> None:
        self.con.execute("DROP TABLE IF EXISTS meta")  # read by nothing after the order
        self.flush()

    def _lexsorted(self, ranks: np.ndarray, sources: Coded, rank: np.ndarray) -> np.ndarray:
        """The total order by a lexsort of whole key arrays: keys past one int64's range."""
        source_rank = ranks[sources.codes] if len(ranks) else np.zeros(0, dtype=np.int64)
        longer_first = np.empty(len(rank), dtype=np.int64)
        for rows, length, missing in self._lengths():
            longer_first[rows] = np.where(missing, np.iinfo(np.int64).max, -length)
        self.drop_lengths()
        return sorted_by(source_rank, longer_first, rank)

    def batches(self, sql: str, rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """A query's result a batch at a time."""
        reader = self.con.sql(sql).to_arrow_reader(rows)
        yield from reader

    def register(self, name: str, table: pa.Table) -> None:
        self.con.register(name, table)

    def unregister(self, name: str) -> None:
        self.con.unregister(name)

    def by_row(self, column: str) -> pa.Array:
        """One string column of every record, indexed by row."""
        table = self.con.sql(f"SELECT {column} FROM recs ORDER BY row").to_arrow_table()
        return table.column(0).combine_chunks()

    def object_lines(self, rows: np.ndarray) -> dict[int, tuple[str, int]]:
        """(object, line) of a few rows."""
        self.register("wanted", pa.table({"row": pa.array(rows, pa.int64())}))
        got = self.con.execute(
            "SELECT r.row, r.object, r.line FROM recs r JOIN wanted w USING (row)"
        ).fetchall()
        self.unregister("wanted")
        return {int(row): (obj, int(line)) for row, obj, line in got}


def value_changes(values: pa.Array, previous: pa.Array | None) -> np.ndarray:
    """Per position of sorted ``values``, whether it differs from the one before (``previous``
    for the first, a one-value array or None); null equals null, as in a sort's rank."""
    first = values.slice(0, 1) if previous is None else previous
    before = pa.concat_arrays([first, values.slice(0, len(values) - 1)])
    equal = pc.fill_null(pc.equal(values, before), False)
    both_null = pc.and_(pc.is_null(values), pc.is_null(before))
    changed = np.asarray(pc.invert(pc.or_(equal, both_null)).to_numpy(zero_copy_only=False))
    if previous is None:
        changed[0] = True
    return changed


def text_lengths(path: Path, batch_rows: int = 1024) -> np.ndarray:
    """Code point length of every text of a chunk file, reading a page at a time (a chunk's
    text column can be one large row group)."""
    batches = streamed(path, batch_rows, ["text"])
    parts = [pc.utf8_length(batch.column(0)).to_numpy().astype(np.int64) for batch in batches]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def chunk_lengths(
    ws: Workspace, chunks: list[ChunkRecords], known: Mapping[str, str], read: bool = True
) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Each chunk's text lengths, read back from ``known`` (records digest -> lengths digest: a
    parent's, so an unchanged chunk's text column is not read again) or counted from its text
    column by a task per chunk (:func:`count_lengths`, on the runner's workers when the work is
    large enough); and one ``{records, lengths}`` ref per chunk for the layer to list. Without
    ``read`` no lengths come back (the runner's coding reads them in its tasks, verified)."""
    missing = [c for c in chunks if c.records["digest"] not in known]
    size = sum(c.stored_bytes() for c in missing)
    counted = pooled(ws, count_lengths, missing, input_bytes=size)
    digests = {**known, **{c.records["digest"]: d for c, d in zip(missing, counted, strict=True)}}
    arrays, refs = [], []
    for chunk in chunks:
        records, digest = chunk.records["digest"], digests[chunk.records["digest"]]
        if read:
            arrays.append(stored_lengths(ws, chunk, digest))
        refs.append({"records": records, "lengths": make_ref(digest, BINARY, 8 * chunk.count)})
    return arrays, refs


def stored_lengths(ws: Workspace, chunk: ChunkRecords, digest: str) -> np.ndarray:
    """A chunk's text lengths from the store (``digest``: little-endian int64, verified as
    read), one per record of the chunk, or an error naming both."""
    data = ws.cas.get_bytes(digest, f"text lengths of {chunk.key}")
    lengths = np.frombuffer(data, dtype="<i8").astype(np.int64)
    if len(lengths) != chunk.count:
        raise ValueError(f"text lengths {digest} of {chunk.key}: {len(lengths)} rows")
    return lengths


def count_lengths(ws: Workspace, chunk: ChunkRecords, spec: object, done: object) -> str:
    """One chunk's text lengths (little-endian int64), verified, counted and stored; their
    digest."""
    records = chunk.records["digest"]
    ws.cas.verify(records, chunk.what)
    return put_bytes(ws.cas, text_lengths(ws.cas.path(records)).astype("<i8").tobytes())["digest"]
