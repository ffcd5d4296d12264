"""The held-out gate's changed records: the set difference over each object's number is the
set difference over the objects themselves (objects differing only in their last character,
null objects, repeated rows, an object on one side only)."""

import random
from pathlib import Path

import duckdb
import pyarrow as pa

from corpus_assets.core.publication.heldout_check import changed_records
from corpus_assets.core.publication.heldout_parts import Side, changed_by_parts
from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.storage.artifacts import PARQUET, table_bytes
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles, ordered_parts
from corpus_assets.core.training_view.splits import searched_records

OBJECTS = [f"sha256:{'0' * 63}{k}" for k in range(4)] + [None]
BY_STRINGS = """
SELECT record_id FROM (
    SELECT record_id, object, line, split FROM child
    EXCEPT SELECT record_id, object, line, split FROM parent)
"""


def _rows(rng: random.Random, objects: list[str | None]) -> pa.Table:
    rows = [
        (f"r{rng.randrange(40)}", rng.choice(objects), rng.randrange(3), rng.choice("tv"))
        for _ in range(120)
    ]
    names = ("record_id", "object", "line", "split")
    return pa.table({name: [row[n] for row in rows] for n, name in enumerate(names)})


def test_the_changed_records_are_those_of_the_difference_over_the_objects() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        with duckdb.connect() as con:
            con.register("child", _rows(rng, OBJECTS))
            con.register("parent", _rows(rng, OBJECTS[1:]))  # the first object is new
            found = changed_records(
                con, "SELECT * FROM child", "SELECT * FROM parent", "SELECT object FROM parent"
            ).to_pylist()
            expected = con.sql(BY_STRINGS).fetchnumpy()["record_id"].tolist()
        assert sorted(found) == sorted(expected) and found, seed


# --- the difference read from the parts a child does not share (``heldout_parts``) ---

SEARCHED = """
SELECT record_id FROM (
    SELECT record_id, object, line, split FROM ({child})
    EXCEPT SELECT record_id, object, line, split FROM ({parent}))
"""


def _clusters_rows(chunk: int, rows: int, reps: list[str]) -> list[dict[str, object]]:
    """A chunk's clusters rows: every third a removed duplicate of one of ``reps`` (any
    chunk's), one excluded row, the rest kept."""
    out = []
    for line in range(rows):
        rid = f"c{chunk}-r{line}"
        removed = line % 3 == 2 and reps
        out.append(
            {
                "record_id": rid,
                "object": f"obj{chunk}",
                "line": line,
                "leakage_id": rid,
                "verdict": "excluded" if line == 1 else ("near_duplicate" if removed else "keep"),
                "is_representative": not removed and line != 1,
                "representative_id": reps[line % len(reps)] if removed else "",
            }
        )
    return out


def _put(
    cas: ContentStore, chunk: str, rows: list[dict[str, object]], schema: pa.Schema
) -> ChunkPart:
    table = pa.Table.from_pylist(rows, schema)
    data = table_bytes(table)
    digest, size = cas.put_bytes(data), len(data)
    return ChunkPart(
        chunk=chunk,
        records=f"rec-{chunk}",
        digest=digest,
        media=PARQUET,
        size=size,
        count=len(rows),
    )


CLUSTERS = pa.schema(
    [
        ("record_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("leakage_id", pa.string()),
        ("verdict", pa.string()),
        ("is_representative", pa.bool_()),
        ("representative_id", pa.string()),
    ]
)
MEMBERS = pa.schema([("record_id", pa.string()), ("split", pa.string())])


def _snapshot(
    cas: ContentStore, clusters: dict[int, list[dict[str, object]]], splits: dict[str, str]
) -> tuple[tuple[ChunkPart, ...], tuple[ChunkPart, ...]]:
    """Clusters and members parts, a chunk each; members: the kept rows with a split."""
    cparts, mparts = [], []
    for chunk, rows in sorted(clusters.items()):
        kept = [r for r in rows if r["is_representative"] and r["record_id"] in splits]
        members = [{"record_id": r["record_id"], "split": splits[r["record_id"]]} for r in kept]
        cparts.append(_put(cas, f"k{chunk}", rows, CLUSTERS))
        mparts.append(_put(cas, f"k{chunk}", members, MEMBERS))
    return tuple(cparts), tuple(mparts)


def test_the_changed_records_read_from_the_unshared_parts_are_the_whole_difference(
    tmp_path: Path,
) -> None:
    """Appended chunks whose duplicates stand behind old members, an edited chunk, members of
    unchanged chunks moved to another split (their removed copies elsewhere move with them),
    a member quarantined: the same ids as the difference over every row, and a shared part's
    rows among them (only the moved members' rows)."""
    cas = ContentStore(tmp_path / "cas")
    files = VerifiedFiles(cas)
    for seed in range(12):
        rng = random.Random(seed)
        old = {c: _clusters_rows(c, rng.randrange(6, 14), [f"c{(c + 1) % 4}-r0"]) for c in range(4)}
        ids = [r["record_id"] for rows in old.values() for r in rows if r["is_representative"]]
        splits = {rid: rng.choice(["train", "validation", "test"]) for rid in ids}
        new = dict(old)
        new[4] = _clusters_rows(4, rng.randrange(3, 9), rng.sample(ids, 3))  # an appended object
        new[2] = _clusters_rows(2, len(old[2]) + 1, [f"c{rng.randrange(4)}-r0"])  # edited
        moved = dict(splits)
        moved |= {r["record_id"]: "train" for r in new[4] if r["is_representative"]}
        moved |= {r["record_id"]: "test" for r in new[2] if r["is_representative"]}
        for rid in rng.sample(ids, 3):  # members of chunks whose clusters part is shared
            moved[rid] = "validation" if splits[rid] != "validation" else "train"
        del moved[rng.choice(ids)]  # quarantined: its rows are searched no more
        parent, child = _snapshot(cas, old, splits), _snapshot(cas, new, moved)
        with duckdb.connect() as con:
            for name, (_, members) in (("m_child", child), ("m_parent", parent)):
                con.execute(
                    f"CREATE VIEW {name} AS {ordered_parts(files.paths(p.digest for p in members))}"
                )
            found = changed_by_parts(
                con, files, Side(*child, "m_child"), Side(*parent, "m_parent")
            ).to_pylist()
            every = [
                searched_records(
                    f"({ordered_parts(files.paths(p.digest for p in side[0]))})", members
                )
                for side, members in ((child, "m_child"), (parent, "m_parent"))
            ]
            expected = con.sql(SEARCHED.format(child=every[0], parent=every[1])).fetchnumpy()
        expected_ids = sorted(expected["record_id"].tolist())
        assert sorted(found) == expected_ids, seed
        in_shared = [r for r in found if r.split("-")[0] in ("c0", "c1", "c3")]
        assert in_shared, seed  # moved members' rows of shared parts: not from changed parts
