"""What a child's dedup records of its clusters table for readers comparing it with its
parent's: the chunks holding every row it joined rather than copied."""

from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.reuse import Reuse, changed_chunks, remember_changed
from corpus_assets.core.storage.catalog import Catalog


def test_the_chunks_holding_joined_rows_are_remembered_by_both_tables(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    chunk_rows = [("sha256:a", 3), ("sha256:b", 0), ("sha256:c", 4), ("sha256:d", 2)]
    fresh = np.array([3, 6, 8], dtype=np.int64)  # rows 3 and 6 in chunk c, 8 in chunk d
    reuse = Reuse(fresh, np.zeros(9, dtype=bool), np.zeros(9, dtype=bool), "parent.parquet")
    remember_changed(catalog, "code@1", ("sha256:parent", "sha256:child"), chunk_rows, reuse)
    found = changed_chunks(catalog, "code@1", "sha256:parent", "sha256:child")
    assert found == {"sha256:c", "sha256:d"}
    assert changed_chunks(catalog, "code@2", "sha256:parent", "sha256:child") is None
    assert changed_chunks(catalog, "code@1", "sha256:other", "sha256:child") is None
