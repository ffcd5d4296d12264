"""The runner's coding (a sample sort by tasks) decides as the driver's sorts and numpy do."""

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup import clusters, task_coding
from corpus_assets.core.dedup import coding as coding_module
from corpus_assets.core.dedup.code_tasks import PARTITION_VALUES, merge_partitions, splitters
from corpus_assets.core.dedup.coding import Coding, DriverCoding, exclusions
from corpus_assets.core.dedup.leakage import leakage_rows
from corpus_assets.core.dedup.output_order import id_ranks
from corpus_assets.core.dedup.partition_db import PartitionDb, chunk_lengths
from corpus_assets.core.dedup.task_coding import TaskCoding
from corpus_assets.core.records.index import RECORD_COLUMNS, ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import put_table

# byte order differs from naive orders here: accents, CJK, astral code points, prefixes
_ALPHABET = ["a", "b", "ab", "B", "é", "e\u0301", "日本", "\U0001f600", "z", "a/b", ""]


def _value(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 3)))


def _records(rng: random.Random, n: int) -> pa.Table:
    """Ids that repeat (across chunks too) or are null, group ids that are null, the record's
    own id, another record's id or a new value, dedup keys that repeat or are null, three
    sources (one unranked) and texts of a few lengths, so the total order's every key counts."""
    ids = [None if rng.random() < 0.03 else _value(rng) for _ in range(n)]
    groups: list[str | None] = []
    for i in range(n):
        pick = rng.random()
        groups.append(
            None
            if pick < 0.15
            else ids[i]
            if pick < 0.6
            else rng.choice(ids)
            if pick < 0.8
            else "g" + _value(rng)
        )
    keys = [None if rng.random() < 0.05 else f"sha256:{rng.randrange(n // 3 + 1):04x}" for _ in ids]
    columns = {field.name: pa.nulls(n, field.type) for field in RECORD_COLUMNS}
    columns |= {
        "record_id": pa.array(ids, pa.string()),
        "group_id": pa.array(groups, pa.string()),
        "dedup_key": pa.array(keys, pa.string()),
        "source_id": pa.array([rng.choice(["s", "t", "u"]) for _ in ids]),
        "kind": pa.array(["messages" if i % 5 == 0 else "document" for i in range(n)]),
        "object": pa.array([f"o{i // 50}" for i in range(n)]),
        "line": pa.array([i % 7 for i in range(n)], pa.int64()),  # lines repeat across objects
        "text": pa.array([rng.choice(["t", "tt", "ttt"]) for _ in ids]),
    }
    return pa.table(columns, schema=RECORD_COLUMNS)


def _chunks(ws: Workspace, table: pa.Table, sizes: list[int]) -> list[ChunkRecords]:
    chunks, start = [], 0
    for n, size in enumerate(sizes):
        ref = put_table(ws.cas, table.slice(start, size))
        chunks.append(ChunkRecords(f"s/chunk-{n}", ref, size))
        start += size
    return chunks


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's dense rank: two codings agree on order and equality iff these are equal."""
    return np.unique(values, return_inverse=True)[1]


_SIZES = [250, 0, 1, 149, 200]  # an empty chunk too
_SOURCES = {"t": 0, "s": 1}  # "u" is not listed: it ranks after both
_REVOKED = {5: "tombstone a", 17: "tombstone b", 300: "tombstone c"}


def _decided(
    ws: Workspace, chunks: list[ChunkRecords], scratch: Path | None
) -> tuple[clusters.Decided, TaskCoding | None]:
    """Verdicts of the chunks with the driver's coding, or the tasks' with ``scratch``."""
    lengths, refs = chunk_lengths(ws, chunks, {})
    starts = np.cumsum([0, *(c.count for c in chunks)])[:-1]
    with PartitionDb.from_chunks(ws, chunks, lengths) as db:
        coding = None
        if scratch is not None:
            digests = [ref["lengths"]["digest"] for ref in refs]
            coding = TaskCoding(ws, chunks, digests, _SOURCES, scratch)
        decided = clusters.decide(db, _SOURCES, dict(_REVOKED), None, coding, starts)
    return decided, coding


@pytest.mark.parametrize("partitions", [None, 1, 3, 7])
def test_task_coding_decides_as_the_driver(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int | None
) -> None:
    """Repeated ids (with their reasons), exact copies in total order, ranks, positions and
    leakage rows: the same from the merge tasks as from the driver's sorts."""
    if partitions is None:
        monkeypatch.delenv("CORPUS_CODE_PARTITIONS", raising=False)
    else:
        monkeypatch.setenv("CORPUS_CODE_PARTITIONS", str(partitions))
    table = _records(random.Random(7), 600)
    ws = open_workspace()
    try:
        chunks = _chunks(ws, table, _SIZES)
        want, _ = _decided(ws, chunks, None)
        got, coding = _decided(ws, chunks, tmp_path)
    finally:
        ws.close()
    assert coding is not None
    assert list(got.excluded.items()) == list(want.excluded.items())
    kinds = {reason.split(" ")[0].rstrip(":") for reason in want.excluded.values()}
    assert kinds == {"tombstone", "duplicate", "id.conflict"}  # every kind of exclusion met
    assert want.edges.exact > 50  # dedup keys repeat among eligible rows
    for name in ("a", "b", "near_jaccard"):
        assert getattr(got.edges, name).tolist() == getattr(want.edges, name).tolist(), name
    assert got.edges.exact == want.edges.exact
    assert got.per_source == want.per_source  # from the runs and the names, no source codes
    assert set(want.per_source) == {"s", "t", "u"}
    n = table.num_rows
    assert got.leakage.rows.span(0, n).tolist() == want.leakage.rows.span(0, n).tolist()
    assert got.leakage.groups == want.leakage.groups
    assert got.positions.rank.span(0, n).tolist() == want.positions.rank.span(0, n).tolist()
    assert got.positions.span(0, n).tolist() == want.positions.span(0, n).tolist()
    every = np.arange(table.num_rows)
    got_looked, want_looked = got.state.look(every), want.state.look(every)
    for name in ("verdict", "match"):
        np.testing.assert_array_equal(getattr(got_looked, name), getattr(want_looked, name))
    got_j, want_j = (d.state.jaccard.of(d.state.look(every)) for d in (got, want))
    np.testing.assert_array_equal(got_j, want_j)
    assert coding.work["code_run_tasks"] == len(chunks)
    assert coding.work["code_order_run_tasks"] == len(chunks)
    # ids, then dedup keys, then the total order
    assert coding.work["code_merge_tasks"] == 3 * (partitions or 1)
    assert not list(tmp_path.glob("run-*")) and not list(tmp_path.glob("merged-keys-*"))
    left = {p.name.split("-", 3)[-1] for p in tmp_path.glob("merged-*")}  # read to the end
    assert left == {f"{f}.npy" for f in (*_KEPT_FILES, *_ORDER_FILES)}  # classes: when run
    assert not (tmp_path / "excluded.npy").exists()
    assert len(list(tmp_path.glob("names-*.arrow"))) == len(chunks)  # for the gather tasks


def test_the_runners_coding_sorts_and_codes_nothing_per_row_on_the_driver(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the runner's path the driver never sorts the total order, ranks every row by id nor
    codes a column of every row (kind, source): those are the tasks'."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a per-row sort or coding on the driver")

    table = _records(random.Random(9), 400)
    ws = open_workspace()
    try:
        chunks = _chunks(ws, table, [150, 250])
        want, _ = _decided(ws, chunks, None)
        for name in ("total_order", "codes", "_coded_few", "_coded", "_coded_ids"):
            monkeypatch.setattr(PartitionDb, name, refused)
        monkeypatch.setattr(coding_module, "id_ranks", refused)
        got, _ = _decided(ws, chunks, tmp_path)
    finally:
        ws.close()
    assert got.per_source == want.per_source and got.edges.a.tolist() == want.edges.a.tolist()


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_task_coding_orders_each_near_class_as_the_driver(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int
) -> None:
    """Each near-dedup class's representatives in total order, and the copies with their
    representatives: the runner's order sort against the driver's total order, over two
    kinds and three sources whose contents name classes one of which prefixes another."""
    monkeypatch.setenv("CORPUS_CODE_PARTITIONS", str(partitions))
    table = _records(random.Random(5), 600)
    content = {"s": "prose", "t": "pro", "u": "prose"}
    answers = []
    ws = open_workspace()
    try:
        chunks = _chunks(ws, table, _SIZES)
        lengths, refs = chunk_lengths(ws, chunks, {})
        digests = [ref["lengths"]["digest"] for ref in refs]
        for scratch in (None, tmp_path):
            with PartitionDb.from_chunks(ws, chunks, lengths) as db:
                coding: Coding = DriverCoding(None, _SOURCES, content)
                if scratch is not None:
                    coding = TaskCoding(ws, chunks, digests, _SOURCES, scratch, content)
                codes = coding.codes(db)
                excluded = exclusions(db, coding.repeated(codes), dict(_REVOKED))
                out = np.array(sorted(excluded), dtype=np.int64)
                exact = coding.exact(db, codes, out)
                classes = {name: rows.rows().tolist() for name, rows in exact.classes.items()}
                answers.append((classes, exact.copies.tolist(), exact.match.tolist(), len(out)))
    finally:
        ws.close()
    want, got = answers
    names = ["document/pro", "document/prose", "messages/pro", "messages/prose"]
    assert list(got[0]) == list(want[0]) == names  # sorted by name: a prefix first
    assert got == want
    held = sum(len(rows) for rows in want[0].values()) + len(want[1]) + want[3]
    assert held == table.num_rows and len(want[1]) > 50  # every row once; copies met


@pytest.mark.parametrize(("partitions", "edges"), [(1, 60), (3, 60), (3, 0)])
def test_task_coding_names_leakage_groups_and_ranks_as_the_coding_sorts(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int, edges: int
) -> None:
    """Leakage rows over edges between any rows (near edges join rows of any group, across
    partitions), none, and ranks: the merges' group files against the driver's group codes."""
    monkeypatch.setenv("CORPUS_CODE_PARTITIONS", str(partitions))
    if partitions > 1:  # each partition's group files read in several slices, the last short
        monkeypatch.setattr(task_coding, "ROOT_SLICE", 37)
    table = _records(random.Random(11), 400)
    rng = np.random.default_rng(11)
    a, b = rng.integers(0, table.num_rows, (2, edges))  # chains, stars and cycles by chance
    ws = open_workspace()
    try:
        chunks = _chunks(ws, table, [150, 250])
        lengths, refs = chunk_lengths(ws, chunks, {})
        with PartitionDb.from_chunks(ws, chunks, lengths) as db:
            expected = db.codes()
            coding = TaskCoding(ws, chunks, [r["lengths"]["digest"] for r in refs], {}, tmp_path)
            codes = coding.codes(db)
            held = (codes.record_id, codes.dedup_key, codes.group_id)
            assert not any(len(c.codes) for c in held)  # the driver holds none of these codes
            want_rank = id_ranks(db, expected.record_id.codes)
            got = coding.leakage(codes, a, b)
            ranks = coding.rank_rows(db, expected)  # as decide reads them after the near stage
    finally:
        ws.close()
    n, some = table.num_rows, rng.integers(0, table.num_rows, 97)  # any rows, repeats
    want = leakage_rows(expected.group_id.codes, a, b)
    rows = got.rows
    assert np.concatenate([rows.span(0, 13), rows.span(13, n)]).tolist() == want.tolist()
    assert rows.of(some).tolist() == want[some].tolist()
    assert got.groups == len(np.unique(want))
    alone = leakage_rows(expected.group_id.codes, a[:0], b[:0])
    assert len(np.unique(want)) < len(np.unique(alone)) or not edges  # the edges joined groups
    assert want_rank.tolist() == ranks.span(0, n).tolist()
    assert ranks.of(some).tolist() == want_rank[some].tolist()
    # what the slices are read from stays in the scratch folder, and goes with it
    left = {p.name.split("-", 3)[-1] for p in tmp_path.glob("merged-ids-*")}
    assert left == {f"{f}.npy" for f in _KEPT_FILES}


# the ids merges' files the output phases read, kept to the end of the layer's run
_KEPT_FILES = ("group_rows", "group_codes", "naming", "named", "rank_rows", "rank_local")
# the order merges' files the near stage's classes are read from (by the driver and the tasks)
_ORDER_FILES = ("order_rows", "order_by_row", "order_at")


def test_splitters_cut_at_distinct_sample_quantiles() -> None:
    samples = ["d", "a", "c", "b", "b", "e", "f", "g"]
    assert splitters(samples, 1) == []
    assert splitters(samples, 3) == ["c", "e"]  # of a..g at 7/3 and 14/3
    assert splitters(["x"] * 9, 4) == ["x"]  # one distinct sample: two partitions
    assert splitters([], 4) == []


def test_merge_partitions_follow_the_values_and_the_task_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORPUS_CODE_PARTITIONS", raising=False)
    big = 1 << 40
    assert merge_partitions(0, 0, big) == 1
    assert merge_partitions(PARTITION_VALUES, 0, big) == 1
    assert merge_partitions(PARTITION_VALUES + 1, 0, big) == 2
    # 1M values of 80 bytes: ~267 MB held in a task's copies -> four tasks under 64 MB each
    assert merge_partitions(1_000_000, 80_000_000, 64 << 20) == 4
    assert merge_partitions(1_000_000, 80_000_000, 1 << 30) == 4  # by the value count
    assert merge_partitions(100_000, 800_000_000, 256 << 20) == 9  # long values: by bytes
    monkeypatch.setenv("CORPUS_CODE_PARTITIONS", "5")
    assert merge_partitions(10, 10, big) == 5


@pytest.mark.parametrize("subset", [False, True])
def test_the_decisions_files_name_every_exclusion_reason(
    demo_home: Path, tmp_path: Path, subset: bool
) -> None:
    """The decisions file the clusters joins read (every row, or the rows of a child's fresh
    chunks) gives each excluded row its own reason and every other row none, and each row its
    table position: the reasons are held for the excluded rows only and looked up a slice at
    a time, the positions worked out a chunk at a time."""
    table = _records(random.Random(7), 600)
    ws = open_workspace()
    try:
        decided, _ = _decided(ws, _chunks(ws, table, _SIZES), None)
    finally:
        ws.close()
    only = np.arange(3, table.num_rows, 2) if subset else None
    written = clusters.write_decisions(decided, tmp_path, rows=37, only=only)  # several slices
    rows = pq.read_table(written.path, columns=["row", "reason", "pos"]).to_pydict()
    names = written.reasons.to_pylist()
    got = {r: names[c] for r, c in zip(rows["row"], rows["reason"], strict=True) if c}
    expected = list(range(table.num_rows)) if only is None else only.tolist()
    assert got == {r: why for r, why in decided.excluded.items() if r in set(expected)}
    assert len(got) > 5
    assert rows["row"] == expected  # each row once, ascending
    every = decided.positions.span(0, table.num_rows)
    assert sorted(every.tolist()) == list(range(table.num_rows))
    assert rows["pos"] == every[expected].tolist()
