"""A full disk during a write (seed 004, issue 19): the error names the file and the data home
and says a rerun resumes; no partial file is left. Needs a small tmpfs (root, as in CI)."""

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus_assets.core.storage.fsio import DiskFullError, write_temp


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_file_and_leaves_no_partial_file(tiny_disk: Path) -> None:
    folder = tiny_disk / "cas" / "tmp"
    with pytest.raises(DiskFullError) as raised:
        write_temp(folder, [b"x" * 4096] * 64)
    assert raised.value.errno == errno.ENOSPC
    assert str(folder) in str(raised.value) and "rerun" in str(raised.value)
    assert list(folder.iterdir()) == []
