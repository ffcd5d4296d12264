"""A poison record (seed 004): an object that cannot be decoded fails its chunk every attempt.
The build goes on, the chunk is a dead letter and ``corpus-assets build`` names it in its one
error line (it crashed with ``KeyError: 'snapshotId'`` reading a failed layer check)."""

from pathlib import Path

from corpus_assets.selftest.cases_build import poisoned_home
from corpus_assets.selftest.lab import PARTITION, Lab


def test_a_build_with_a_poison_object_names_the_dead_letter(tmp_path: Path) -> None:
    home, name = poisoned_home(Lab(tmp_path))
    ran = home.cli("build", "--partition", PARTITION)
    assert ran.code == 1
    line = ran.error_line()
    assert line.startswith("corpus-assets: error: snapshot sha256:"), ran.err[-800:]
    assert f"dead letter open: chunk docs/{name}" in line
