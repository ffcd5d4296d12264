"""A full disk during a write: the error names the file and the data home
and says a rerun resumes; no partial file is left. Needs a small tmpfs (root, as in CI)."""

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from corpus_assets.core.storage.catalog import Catalog, freezes
from corpus_assets.core.storage.fsio import DiskFullError, write_temp


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
