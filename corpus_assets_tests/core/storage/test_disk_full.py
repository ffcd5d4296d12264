"""A full disk during a write: the error names the file and the data home
and says a rerun resumes; no partial file is left. Needs a small tmpfs (root, as in CI)."""

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sqlalchemy import insert, select

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, freezes
from corpus_assets.core.storage.fsio import DiskFullError, write_temp
from corpus_assets.core.storage.parquet_sink import put_tables


def _tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _tmpfs(tmp_path, "64k")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _tmpfs(tmp_path, "1m")


def test_a_full_disk_names_the_file_and_leaves_no_partial_file(tiny_disk: Path) -> None:
    folder = tiny_disk / "cas" / "tmp"
    with pytest.raises(DiskFullError) as raised:
        write_temp(folder, [b"x" * 4096] * 64)
    assert raised.value.errno == errno.ENOSPC
    assert str(folder) in str(raised.value) and "rerun" in str(raised.value)
    assert list(folder.iterdir()) == []


def test_a_full_disk_under_the_sqlite_catalog_names_its_file_and_keeps_what_was_committed(
    small_disk: Path,
) -> None:
    path = small_disk / "catalog.sqlite"
    catalog = Catalog(f"sqlite:///{path}")
    try:
        _fill(catalog, path)
    finally:
        catalog.dispose()  # the tmpfs unmounts only once the file is closed


def _fill(catalog: Catalog, path: Path) -> None:
    row = {"spec_digest": "d" * 64, "fingerprint": "f" * 64, "created_at": 0.0}
    with catalog.begin() as conn:
        conn.execute(insert(freezes), {**row, "partition_key": "kept"})
    with pytest.raises(DiskFullError) as raised:
        for n in range(100_000):  # 1 MB fills long before this
            with catalog.begin() as conn:
                conn.execute(insert(freezes), {**row, "partition_key": f"p{n:06d}" + "x" * 4000})
    assert raised.value.errno == errno.ENOSPC
    assert str(path) in str(raised.value) and "rerun" in str(raised.value)
    with catalog.begin() as conn:
        assert conn.scalar(select(freezes.c.fingerprint).where(freezes.c.partition_key == "kept"))


def test_a_table_streamed_onto_a_full_disk_names_its_file_and_leaves_nothing(
    small_disk: Path,
) -> None:
    """``put_tables`` writes its file under the store's ``tmp`` (not a buffer): a disk that
    fills mid-table is the one-line DiskFullError naming that file, and neither the partial
    file nor an object is left."""
    cas = ContentStore(small_disk / "cas")
    schema = pa.schema([("noise", pa.binary())])
    rng = np.random.default_rng(7)
    parts = (
        pa.table({"noise": [rng.bytes(1024) for _ in range(256)]}, schema=schema)
        for _ in range(16)  # 4 MiB that do not compress, onto a 1 MiB disk
    )
    with pytest.raises(DiskFullError) as raised:
        put_tables(cas, parts, schema)
    assert raised.value.errno == errno.ENOSPC
    assert str(cas.root / "tmp") in str(raised.value) and "rerun" in str(raised.value)
    assert [p for p in (small_disk / "cas").rglob("*") if p.is_file()] == []
