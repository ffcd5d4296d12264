"""The order sort's key string sorts as the tuple it stands for."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.order_key import order_key

# byte order differs from naive orders here: accents, CJK, astral code points, prefixes
_IDS = ["a", "b", "ab", "B", "é", "e\u0301", "日本", "\U0001f600", "z", "a/b", "", "\x7f"]
_GROUPS = ["0document/pro", "0document/prose", "0document/pro/x", "0messages/prose", "0", "1"]


def test_the_key_sorts_as_group_source_rank_longer_first_and_id_with_nulls_last() -> None:
    rng = random.Random(3)
    n = 3000
    rows = [
        (
            rng.choice(_GROUPS),
            rng.randrange(4),
            -rng.choice([0, 1, 2, 15, 16, 255, 256, 70000, 2**40]),  # minus a length
            None if rng.random() < 0.1 else "".join(rng.choices(_IDS, k=rng.randint(1, 3))),
        )
        for _ in range(n)
    ]
    group, rank, longer, ids = (list(c) for c in zip(*rows, strict=True))
    keys = order_key(pa.array(group), np.array(rank), np.array(longer), pa.array(ids, pa.string()))
    by_key = pc.sort_indices(keys).to_pylist()  # Arrow sorts strings by their bytes

    def expected(row: tuple) -> tuple:
        g, r, lf, rid = row
        return (g.encode(), r, lf, rid is None, (rid or "").encode())

    assert [expected(rows[i]) for i in by_key] == sorted(expected(row) for row in rows)
    assert len(set(keys.to_pylist())) == len({expected(row) for row in rows})  # equal iff equal
