"""The pairs table a child stores reads the text digests its parent-pair lookups fetched."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.dedup.pair_cache import PairLookup, store_pairs
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import sql_path

_DIGESTS = [f"sha256:{i:064x}" for i in (5, 3, 9, 1, 7)]


def _db() -> PartitionDb:
    n = len(_DIGESTS)
    records = pa.table(
        {
            "record_id": [f"r{i}" for i in range(n)],
            "source_id": ["s"] * n,
            "object": ["o"] * n,
            "line": pa.array(range(n), pa.int64()),
            "group_id": [f"r{i}" for i in range(n)],
            "dedup_key": [f"k{i}" for i in range(n)],
            "kind": ["document"] * n,
            "length": pa.array([10] * n, pa.int64()),
        }
    )
    db = PartitionDb.from_table(records)
    db.register("digests", pa.table({"row": pa.array(range(n), pa.int64()), "d": _DIGESTS}))
    db.con.execute("CREATE VIEW texts AS SELECT row, d AS text_digest FROM digests")
    return db


def _stored(tmp_path: Path, lookup_first: bool) -> pa.Table:
    parent = tmp_path / "parent-pairs.parquet"
    pairs = {"a": [_DIGESTS[1]], "b": [_DIGESTS[0]], "jaccard": [0.9]}
    pq.write_table(pa.table(pairs), parent)
    cas = ContentStore(tmp_path / f"cas-{lookup_first}")
    with _db() as db:
        lookup = PairLookup(db, f"read_parquet({sql_path(str(parent))})")
        order = np.arange(len(_DIGESTS), dtype=np.int64)
        if lookup_first:
            n = len(order)
            found = lookup.known(order, np.array([1 * n + 0, 4 * n + 2, 3 * n + 0]))
            assert found[0] == 0.9 and np.isnan(found[1:]).all()
            # every chunk file's digests would be read wrongly now: the fetched ones are used
            db.con.execute(
                "CREATE OR REPLACE VIEW texts AS SELECT row, 'x' AS text_digest FROM digests"
            )
        x, y = np.array([1, 4, 3]), np.array([0, 2, 0])
        ref = store_pairs(SimpleNamespace(cas=cas), db, x, y, np.array([0.9, 0.5, 0.6]))
    return get_table(cas, ref)


def test_stored_pairs_read_the_digests_the_lookups_fetched(tmp_path: Path) -> None:
    fetched = _stored(tmp_path, lookup_first=True)
    scanned = _stored(tmp_path, lookup_first=False)
    assert fetched.equals(scanned)
    assert fetched.column("a").to_pylist() == [_DIGESTS[3], _DIGESTS[1], _DIGESTS[4]]
