"""A child's record codes from its parent's tables, so the partition's strings are not sorted.

Coding sorts every record id, group id and dedup key of the partition (~1.1 of a +1% child's
5.5 CPU-s at 1.1 GB), yet a child's rows are mostly its parent's (same canonical chunks, same
columns line for line). Dedup reads those codes only for byte order (record and group ids:
table positions, the smallest group of a component) and equality (dedup keys, repeated ids)
(:func:`.clusters.decide`), so any codes with the same order and equalities give the same
verdicts. Each of the parent's clusters parts lists its chunk's record ids sorted, its
decisions give every row's rank among all of them (``rank``) and name each dedup key's first
row (an exact copy's match, else the row itself). Only the values of the new rows are placed
among the parent's: in each part, each row group is stably sorted with the new values that fall
in it (sorted input, cheap) and the counts of smaller ids are summed over the parts; a new key
is looked up among the parent's keys by hash (group ids other than their record ids are placed
too, the parent's with a second pass). None (the sorts) when the parent excluded a row (its
keys' first rows are not all named), lists a record id twice in a part, wrote no ranks, or
when many rows are new (or parts times new ids outweigh the parent's rows).
"""

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.partition_db import Coded, PartitionDb, code_dtype
from corpus_assets.core.dedup.verdicts import EXACT_CODE, EXCLUDED_CODE
from corpus_assets.core.storage.cas_queries import streamed

NEW_SHARE = 8  # more than one row in NEW_SHARE new: the sorts (what is placed is held)
PLACED_SHARE = 4  # parts x new ids beyond PLACED_SHARE x the parent's rows: the sorts
BATCH_ROWS = 1 << 16


class Carried(NamedTuple):
    """Record id, dedup key and group id codes by row (as :meth:`PartitionDb.codes`'s)."""

    record_id: Coded
    dedup_key: Coded
    group_id: Coded


class _Placed(NamedTuple):
    """Sorted distinct values and, for each, how many parent values are smaller (``at``) and
    whether the parent value there is equal."""

    values: pa.Array
    at: np.ndarray
    equal: np.ndarray


class _Groups(NamedTuple):
    """The parent's group ids other than their record ids: table positions and values."""

    at: np.ndarray
    values: pa.Array


def carried_codes(
    db: PartitionDb, child_to_parent: np.ndarray, decisions: str, clusters: list[str]
) -> Carried | None:
    """The codes of ``db``'s rows given each row's parent row (-1: new) and the parent's
    decisions and clusters parts files (verified, in order); None when they cannot be
    carried."""
    n = len(child_to_parent)
    new_rows = np.flatnonzero(child_to_parent < 0)
    if not n or len(new_rows) * NEW_SHARE > n:
        return None
    parent = _parent_rows(decisions)
    fresh = _new_values(db, new_rows)
    if parent is None or fresh is None or int(child_to_parent.max()) >= len(parent.pos):
        return None  # (or the decisions do not list the parent's chunks' rows)
    rows, ids, groups, keys = fresh
    if len(clusters) * len(ids) > PLACED_SHARE * len(parent.pos):
        return None  # every part places every new id: more than sorting them all
    other = ~pc.equal(groups, ids).to_numpy(zero_copy_only=False)
    new_groups = groups.filter(pa.array(other))
    placed_keys = _distinct(keys)
    scan = _scan_parent(clusters, parent, _distinct(pa.concat_arrays([ids, new_groups])))
    if scan is None:
        return None
    found = _find_keys(clusters, placed_keys)
    placed, old_groups = scan
    if len(old_groups.at):  # placed again with them: a second pass over the parent's ids
        values = pa.concat_arrays([placed.values, old_groups.values])
        placed = _place_all(clusters, _distinct(values))
    old = np.flatnonzero(child_to_parent >= 0)
    count = len(parent.pos)
    ranks, codes = _id_codes(placed, count)
    old_rank = parent.rank[child_to_parent[old]]
    record = np.empty(n, dtype=code_dtype(count + len(placed.values)))
    record[old] = ranks[old_rank]
    record[rows] = codes[_index(ids, placed.values)]
    group = record.copy()
    group[rows[other]] = codes[_index(new_groups, placed.values)]
    child_at = np.full(count, -1, dtype=np.int64)  # parent rank -> child row
    child_at[old_rank] = old
    kept = child_at[old_groups.at] >= 0
    group[child_at[old_groups.at[kept]]] = codes[
        _index(old_groups.values.filter(pa.array(kept)), placed.values)
    ]
    key_codes = _key_codes(
        child_to_parent, old, parent.head, parent.pos, rows, keys, placed_keys, found
    )
    return Carried(Coded(record, []), Coded(key_codes, []), Coded(group, []))


class _Parent(NamedTuple):
    """Per parent row: its clusters table position, its record id's rank and the first row of
    its dedup key."""

    pos: np.ndarray
    rank: np.ndarray
    head: np.ndarray


def _parent_rows(path: str) -> _Parent | None:
    """Per parent row its table position, rank and the first row of its dedup key, read a
    batch at a time; None when the parent excluded a row (an excluded row's key names no first
    row) or its decisions hold no ranks (written before parts)."""
    parquet = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    if "rank" not in parquet.schema_arrow.names:
        return None
    rows = parquet.metadata.num_rows
    pos, rank = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)
    head = np.empty(rows, dtype=np.int64)
    columns, lo = ["verdict", "match", "pos", "rank", "reason"], 0
    for batch in parquet.iter_batches(BATCH_ROWS, columns=columns, use_threads=False):
        verdict, match, at, ranked, reason = (batch.column(c) for c in columns)
        verdicts = verdict.to_numpy()
        if (verdicts == EXCLUDED_CODE).any() or pc.any(pc.not_equal(reason, "")).as_py():
            return None
        hi = lo + len(batch)
        pos[lo:hi], rank[lo:hi] = at.to_numpy(), ranked.to_numpy()
        head[lo:hi] = np.where(verdicts == EXACT_CODE, match.to_numpy(), np.arange(lo, hi))
        lo = hi
    if not (_permutation(pos) and _permutation(rank)):
        return None
    return _Parent(pos, rank, head)


def _permutation(values: np.ndarray) -> bool:
    """Whether ``values`` are 0..len-1, each once."""
    if not len(values):
        return True
    if values.min() < 0 or values.max() >= len(values):
        return False
    seen = np.zeros(len(values), dtype=bool)
    seen[values] = True
    return bool(seen.all())


def _new_values(
    db: PartitionDb, new_rows: np.ndarray
) -> tuple[np.ndarray, pa.Array, pa.Array, pa.Array] | None:
    """The new rows and their record ids, group ids and dedup keys, read from the chunk files
    holding them only; None when one is null (the sorts place nulls)."""
    if not len(new_rows):
        empty = pa.array([], pa.string())
        return new_rows, empty, empty, empty
    sql = f"SELECT row, record_id, group_id, dedup_key FROM {db.recs_of(new_rows)}"
    table = db.con.sql(sql).to_arrow_table()
    if not len(table):
        return None
    rows = table.column("row").to_numpy()
    wanted = np.zeros(int(max(rows.max(), new_rows.max())) + 1, dtype=bool)
    wanted[new_rows] = True
    table = table.filter(pa.array(wanted[rows]))  # a file two chunks share: the new rows only
    ids, groups, keys = (
        table.column(c).combine_chunks().cast(pa.string())
        for c in ("record_id", "group_id", "dedup_key")
    )
    if ids.null_count or groups.null_count or keys.null_count or len(table) != len(new_rows):
        return None
    rows = np.asarray(table.column("row").to_numpy(), dtype=np.int64)
    return rows, ids, groups, keys


def _distinct(values: pa.Array) -> pa.Array:
    unique = pc.unique(values)
    return unique.take(pc.sort_indices(unique))


def _index(values: pa.Array, among: pa.Array) -> np.ndarray:
    return pc.index_in(values, value_set=among).to_numpy(zero_copy_only=False).astype(np.int64)


class _Placer:
    """Values (sorted, distinct) placed among the parent's record ids as its table's batches
    pass (ascending, checked): for each, how many ids are smaller and whether one is equal."""

    def __init__(self, values: pa.Array, rows: int) -> None:
        self.values, self.rows = values, rows
        self.at = np.full(len(values), rows, dtype=np.int64)  # past every id, unless placed
        self.equal = np.zeros(len(values), dtype=bool)
        self.start, self.done, self.last = 0, 0, None

    def feed(self, record: pa.Array) -> bool:
        """Place the values up to this batch's last id; False when ids repeat, are null or are
        out of order."""
        if not len(record):
            return True
        if record.null_count or not _ascending(record, self.last):
            return False
        self.last = last = record[len(record) - 1]
        done, values = self.done, self.values.slice(self.done)
        upto = done + int(pc.sum(pc.less_equal(values, last)).as_py() or 0)
        at, equal = _place(record, self.values.slice(done, upto - done))
        self.at[done:upto], self.equal[done:upto] = self.start + at, equal
        self.start, self.done = self.start + len(record), upto
        return True

    def placed(self) -> _Placed:
        return _Placed(self.values, self.at, self.equal)


def _scan_parent(
    paths: list[str], parent: _Parent, ids: pa.Array
) -> tuple[_Placed, _Groups] | None:
    """One pass over the parent's clusters parts (each sorted by record id): ``ids`` placed
    among its record ids (the counts of smaller ids summed over the parts), and its group ids
    other than their record ids, by rank. None when the parts do not line up (row count, a
    repeated or null id in a part, a null group)."""
    rank_at = np.empty(len(parent.pos), dtype=np.int64)  # table position -> rank
    rank_at[parent.pos] = parent.rank
    total, at, values, start = _Placed(ids, *_nothing_placed(len(ids))), [], [], 0
    for path in paths:
        placer = _Placer(ids, pq.ParquetFile(path).metadata.num_rows)
        for batch in streamed(path, BATCH_ROWS, ["record_id", "group_id"]):
            record, group = batch.column(0), batch.column(1)
            if group.null_count or not placer.feed(record):
                return None
            other = pc.invert(pc.equal(group, record))
            if pc.any(other).as_py():
                here = start + placer.start - len(record)
                at.append(rank_at[here + np.flatnonzero(other.to_numpy(False))])
                values.append(group.filter(other))
        if placer.start != placer.rows or start + placer.start > len(rank_at):
            return None
        total = _summed(total, placer.placed())
        start += placer.start
    if start != len(rank_at):
        return None
    groups = _Groups(
        np.concatenate(at) if at else np.empty(0, dtype=np.int64),
        pa.concat_arrays(values) if values else pa.array([], pa.string()),
    )
    return total, groups


def _place_all(paths: list[str], ids: pa.Array) -> _Placed:
    """``ids`` placed among the parent's record ids (checked by a first pass already)."""
    total = _Placed(ids, *_nothing_placed(len(ids)))
    for path in paths:
        placer = _Placer(ids, pq.ParquetFile(path).metadata.num_rows)
        for batch in streamed(path, BATCH_ROWS, ["record_id"]):
            placer.feed(batch.column(0))
        total = _summed(total, placer.placed())
    return total


def _nothing_placed(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)


def _summed(total: _Placed, part: _Placed) -> _Placed:
    """Placements over two disjoint sets of ids: smaller ids counted in both, equal in either."""
    return _Placed(total.values, total.at + part.at, total.equal | part.equal)


def _find_keys(paths: list[str], keys: pa.Array) -> np.ndarray:
    """Per value of ``keys`` a parent table position holding it (-1: none)."""
    key_pos = np.full(len(keys), -1, dtype=np.int64)
    start = 0
    for path in paths:
        for batch in streamed(path, BATCH_ROWS, ["dedup_key"]):
            found = pc.index_in(batch.column(0), value_set=keys)
            valid = pc.is_valid(found)
            hit = np.flatnonzero(valid.to_numpy(zero_copy_only=False))
            key_pos[found.filter(valid).to_numpy().astype(np.int64)] = start + hit
            start += len(batch)
    return key_pos


def _ascending(record: pa.Array, last: pa.Scalar | None) -> bool:
    """Strictly ascending within the batch and after the previous batch's last id."""
    if last is not None and not pc.less(last, record[0]).as_py():
        return False
    if len(record) < 2:
        return True
    return bool(pc.all(pc.less(record.slice(0, len(record) - 1), record.slice(1))).as_py())


def _place(record: pa.Array, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``values`` (sorted, none past the batch's last id) goes among ``record``
    (sorted): how many ids are smaller, by a stable sort with the values first (a value
    stands before an equal id), and whether the id there is equal."""
    if not len(values):
        return np.empty(0, dtype=np.int64), np.zeros(0, dtype=bool)
    order = pc.sort_indices(pa.concat_arrays([values, record])).to_numpy()
    place = np.empty(len(order), dtype=np.int64)
    place[order] = np.arange(len(order), dtype=np.int64)
    at = place[: len(values)] - np.arange(len(values), dtype=np.int64)
    return at, pc.equal(record.take(pa.array(at)), values).to_numpy(zero_copy_only=False)


def _id_codes(placed: _Placed, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes in byte order of the parent's ids (by table position) and of the placed values:
    a placed value equal to a parent id takes its code, another goes before the id it
    precedes."""
    other = ~placed.equal
    before = np.cumsum(other) - other  # placed values of their own before each one
    own_at = placed.at[other]  # ascending
    positions = np.arange(rows + 1, dtype=np.int64)
    ranks = positions + np.searchsorted(own_at, positions, side="right")
    codes = np.where(placed.equal, ranks[np.minimum(placed.at, rows)], placed.at + before)
    return ranks[:rows], codes


def _key_codes(
    child_to_parent: np.ndarray,
    old: np.ndarray,
    head: np.ndarray,
    pos: np.ndarray,
    rows: np.ndarray,
    keys: pa.Array,
    placed: pa.Array,
    key_pos: np.ndarray,
) -> np.ndarray:
    """Dedup key codes: the parent row of a parent key's first row, the parent's row count on
    for a key the parent lacks."""
    parents = len(head)
    codes = np.empty(len(child_to_parent), dtype=code_dtype(parents + len(placed)))
    codes[old] = head[child_to_parent[old]]
    row_at = np.empty(parents, dtype=np.int64)
    row_at[pos] = np.arange(parents, dtype=np.int64)
    found = key_pos >= 0
    by_value = np.where(found, head[row_at[np.maximum(key_pos, 0)]], 0)
    by_value[~found] = parents + np.arange(len(placed), dtype=np.int64)[~found]
    codes[rows] = by_value[_index(keys, placed)]
    return codes
