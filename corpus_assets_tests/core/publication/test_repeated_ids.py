"""The repeated member ids the gate reports (``rules.REPEATED_IDS``): grouped by the ids'
hashes first, they are exactly the ids repeated, with their counts and splits, in id order."""

import random

import duckdb
import pyarrow as pa
import pytest

from corpus_assets.core.publication.rules import REPEATED_IDS

# the query grouping by the ids themselves (a null id is no repeated id: ``IN`` drops it)
BY_IDS = """
WITH repeated AS (SELECT record_id FROM members GROUP BY record_id HAVING count(*) > 1)
SELECT record_id, count(*), list_sort(list(DISTINCT split)) FROM members
WHERE record_id IN (SELECT record_id FROM repeated) GROUP BY record_id ORDER BY record_id
"""


@pytest.mark.parametrize("seed", range(12))
def test_the_repeated_ids_are_those_grouped_by_id(seed: int) -> None:
    """Random members (ids repeated in one split, in two, three times, a null id, none)."""
    rng = random.Random(seed)
    n = rng.randrange(0, 300)
    ids = [rng.choice([None, *(f"r{k}" for k in range(rng.randrange(1, 400)))]) for _ in range(n)]
    splits = [rng.choice(["train", "test", "validation"]) for _ in ids]
    with duckdb.connect() as con:
        con.register(
            "members", pa.table({"record_id": pa.array(ids, pa.string()), "split": splits})
        )
        found = con.execute(REPEATED_IDS).fetchall()
        assert found == con.execute(BY_IDS).fetchall()
    assert found or n < 30  # most seeds repeat an id


def test_an_id_in_two_splits_is_reported_with_both() -> None:
    members = pa.table(
        {
            "record_id": ["a", "b", "a", "c", "c", "c"],
            "split": ["train", "train", "test", "train", "train", "train"],
        }
    )
    with duckdb.connect() as con:
        con.register("members", members)
        assert con.execute(REPEATED_IDS).fetchall() == [
            ("a", 2, ["test", "train"]),
            ("c", 3, ["train"]),
        ]
