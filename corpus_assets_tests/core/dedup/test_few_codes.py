"""Kind and source codes are one byte a row; what multiplies them widens first."""

from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.coding import near_classes
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.dedup.verdicts import VERDICTS, Verdicts
from corpus_assets.core.records.index import RECORD_COLUMNS

SOURCES = [f"s{k:03d}" for k in range(100)]  # 100 sources x 2 kinds or x 4 verdicts > 127


def _codes() -> SimpleNamespace:
    n = 2 * len(SOURCES)
    columns = {field.name: pa.nulls(n, field.type) for field in RECORD_COLUMNS}
    columns |= {
        "record_id": pa.array([f"r{k}" for k in range(n)]),
        "source_id": pa.array(SOURCES * 2),
        "kind": pa.array(["document"] * len(SOURCES) + ["messages"] * len(SOURCES)),
        "text": pa.array(["t"] * n),
    }
    with PartitionDb.from_table(pa.table(columns, schema=RECORD_COLUMNS)) as db:
        return SimpleNamespace(codes=db.codes(), n=n)


def test_few_valued_codes_are_a_byte_and_their_products_do_not_wrap() -> None:
    got = _codes()
    codes = got.codes
    assert codes.kind.codes.dtype == codes.source_id.codes.dtype == np.int8
    # every source's verdict counts, indexed by int8 source codes past 32 (code * 4 + verdict
    # would exceed int8 there)
    verdicts = Verdicts(2 * len(SOURCES))
    verdicts.set(np.arange(len(SOURCES)), VERDICTS.index("excluded"))
    per_source = verdicts.per_source(codes.source_id.codes, codes.source_id.values)
    assert list(per_source) == SOURCES
    assert all(
        c == {"keep": 1, "exact_duplicate": 0, "near_duplicate": 0, "excluded": 1}
        for c in per_source.values()
    )
    # near-dedup classes: kind code * sources + source code exceeds int8 for messages
    classes = near_classes(codes, np.arange(got.n), {source: "prose" for source in SOURCES})
    assert {name: rows.n for name, rows in classes.items()} == {
        "document/prose": len(SOURCES),
        "messages/prose": len(SOURCES),
    }
