"""Every command closes the data home it opened (``cli.common.opened``): the catalog's engine is
disposed, so no connection of its pool keeps the SQLite catalog open after the command, whether
it answered or was refused."""

import os
from pathlib import Path

import pytest

from corpus_assets.cli.main import main
from corpus_assets.core.storage.catalog import Catalog

UNKNOWN = "sha256:" + "0" * 64


def _open_catalog_files(home: Path) -> list[str]:
    """This process's open files that are the catalog or its WAL/shared-memory files."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while listing
        if target.startswith(str(home / "catalog.sqlite")):
            found.append(target)
    return found


def test_every_command_closes_the_catalog_it_opened(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Catalog] = []
    init = Catalog.__init__

    def kept(self: Catalog, url: str) -> None:
        init(self, url)
        made.append(self)  # held here: garbage collection cannot close a leaked engine

    monkeypatch.setattr(Catalog, "__init__", kept)
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "q1", "text": "what is the capital of nowhere at all"}\n')
    commands = [
        (["status"], 0),
        (["status", "--json"], 0),
        (["history", "demo"], 0),
        (["benchmark", "add", "quiz", str(items)], 0),  # writing: under the CAS lock
        (["benchmark", "list"], 0),
        (["benchmark", "remove", "quiz"], 0),
        (["excluded", UNKNOWN], 1),
        (["trust", "list"], 0),
        (["tombstone", "add", "--record", "essays/e0001", "--reason", "test"], 0),
        (["tombstone", "hits", "1"], 0),
        (["gc", "--dry-run"], 0),  # the config's home, gc's exclusive lock
        (["scrub"], 0),
        (["show", UNKNOWN], 1),  # refused: closed all the same
        (["verify", UNKNOWN], 1),
        (["lineage", UNKNOWN, "--record", "essays/e0001"], 1),
        (["rollback", UNKNOWN], 1),
    ]
    for argv, code in commands:
        assert main(argv) == code, argv
        assert made, f"{argv}: opened no catalog"
        assert _open_catalog_files(demo_home) == [], f"{argv} left the catalog open"
