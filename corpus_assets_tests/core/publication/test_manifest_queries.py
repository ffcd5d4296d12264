"""The release stage's out-of-core helpers on real files: DuckDB joins, streamed verification."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.publication.manifest_queries import BATCH_BYTES, batch_rows
from corpus_assets.core.publication.shadow import member_changes
from corpus_assets.core.storage.artifacts import put_table, put_table_file, table_bytes
from corpus_assets.core.storage.cas import ContentStore, CorruptObjectError
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.digests import sha256_digest


def test_member_changes_match_the_set_arithmetic(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    old = pa.table({"record_id": ["a", "b", "c", "d"], "split": ["train", "test", "train", "x"]})
    new = pa.table({"record_id": ["e", "c", "b", "f"], "split": ["train", "train", "train", "x"]})
    changes = member_changes(cas, [put_table(cas, old)], [put_table(cas, new)])
    assert changes == {
        "added": 2,
        "removed": 2,
        "split_migrations": 1,
        "examples": {"added": ["e", "f"], "removed": ["a", "d"], "migrated": ["b: test -> train"]},
    }


def test_member_changes_over_parts_read_only_unshared_parts_and_equal_the_whole_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two members tables sharing a part: the diff of the parts equals the diff of the
    concatenated tables (a twin id in a shared part included, last row winning), and the
    shared part's ids are never listed as changed."""
    cas = ContentStore(tmp_path / "cas")

    def table(ids: str, splits: str) -> pa.Table:
        return pa.table({"record_id": list(ids), "split": splits.split()})

    shared = table("stuv", "train test train x")
    old = [table("ab", "train test"), shared, table("s", "test")]  # s's last row: test
    new = [table("bc", "train train"), shared]  # s's last row: train, in the shared part
    whole = member_changes(
        cas, [put_table(cas, pa.concat_tables(old))], [put_table(cas, pa.concat_tables(new))]
    )
    listed: list[list[str]] = []
    real = VerifiedFiles.paths
    monkeypatch.setattr(
        VerifiedFiles, "paths", lambda self, d, w="": listed.append(list(d)) or real(self, d, w)
    )
    parts = member_changes(cas, [put_table(cas, t) for t in old], [put_table(cas, t) for t in new])
    assert parts == whole
    assert whole["examples"]["migrated"] == ["b: test -> train", "s: test -> train"]
    assert put_table(cas, shared)["digest"] not in listed[0]  # the ids read: unshared only


def test_verified_files_rehash_once_and_name_a_corrupt_object(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    digest = put_table(cas, pa.table({"x": [1, 2, 3]}))["digest"]
    path = cas.path(digest)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CorruptObjectError, match=r"CAS members table .* is corrupt"):
        VerifiedFiles(cas).path(digest, "members table")
    assert VerifiedFiles(cas, {digest}).path(digest) == str(path)  # verify already did


def test_put_table_file_writes_the_bytes_put_table_writes(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    table = pa.table({"record_id": [f"r{i}" for i in range(5000)], "n": list(range(5000))})
    ref = put_table_file(cas, table, tmp_path / "t.parquet")
    assert ref == put_table(cas, table)
    assert ref["digest"] == sha256_digest(table_bytes(table))
    assert not (tmp_path / "t.parquet").exists()


def test_batches_of_long_texts_stay_near_the_byte_budget(tmp_path: Path) -> None:
    texts = [f"{i:06d}" * 20_000 for i in range(500)]  # 120 kB each, all different
    pq.write_table(pa.table({"text": texts}), tmp_path / "long.parquet", use_dictionary=False)
    rows = batch_rows(pq.ParquetFile(tmp_path / "long.parquet"), "text")
    assert 1 <= rows < 500 and rows * len(texts[0]) <= 2 * BATCH_BYTES
