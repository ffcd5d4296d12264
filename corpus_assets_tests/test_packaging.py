"""The built wheel: what a user installs. The fault cases (``corpus_assets.selftest``) stay in
the source checkout, and ``corpus-assets selftest`` run from the wheel says so in one line."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from corpus_assets_tests.paths import REPO

UV = REPO / ".tools" / "bin" / "uv"  # the Makefile's uv


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert UV.is_file(), f"{UV} is missing: `make .venv/.synced` installs it"
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [str(UV), "build", "--wheel", "--out-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("corpus_assets-*.whl")
    return built


def test_the_wheel_leaves_the_fault_cases_out(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "corpus_assets/cli/main.py" in names  # the wheel holds the package
    assert not [n for n in names if n.startswith("corpus_assets/selftest/")]


def test_selftest_from_the_wheel_says_it_needs_a_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the checkout's editable install
    probe = "import sys; from corpus_assets.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", probe, "selftest", "--faults", "--list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "corpus-assets: error: selftest needs a source checkout of corpus-assets: the "
        "corpus_assets.selftest package is not installed with the wheel"
    ]
