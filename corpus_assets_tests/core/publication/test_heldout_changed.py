"""The held-out gate's changed records: the set difference over each object's number is the
set difference over the objects themselves (objects differing only in their last character,
null objects, repeated rows, an object on one side only)."""

import random

import duckdb
import pyarrow as pa

from corpus_assets.core.publication.heldout_check import changed_records

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
