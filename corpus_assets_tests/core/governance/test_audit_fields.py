"""Audit fields (who approved, why a tombstone, which run read what) refuse control characters
and line breaks wherever they enter: the CLI, the Dagster job config and the core functions that
write the catalog's events, tombstones, benchmark registry and permits.
A newline in ``approve --by`` used to put a forged line into ``history``."""

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select

from corpus_assets.assets.jobs import ApprovalConfig, approver_identity
from corpus_assets.core.consumption.training import take_permit
from corpus_assets.core.governance import benchmarks, states
from corpus_assets.core.governance.audit_fields import AuditFieldError, audit_field
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import snapshot_events, tombstones

CLI = str(Path(sys.executable).parent / "corpus-assets")
SID = "sha256:" + "0" * 64
FORGED = "alice\n2026-01-01 00:00:00  sha256:beef  APPROVED -> ACTIVE  mallory"


@pytest.mark.parametrize(
    ("value", "position", "code"),
    [
        ("alice\nbob", 6, "U+000A"),
        ("alice\r", 6, "U+000D"),
        ("\x1b[2Jalice", 1, "U+001B"),
        ("al\x00ice", 3, "U+0000"),
        ("alice\x7f", 6, "U+007F"),
        ("alice\x85bob", 6, "U+0085"),  # NEL: a line break to some readers
        ("alice\u2028bob", 6, "U+2028"),  # LINE SEPARATOR
        ("alice\u202ebob", 6, "U+202E"),  # RIGHT-TO-LEFT OVERRIDE: reorders what follows
        ("alice\udcffbob", 6, "U+DCFF"),  # a lone surrogate: argv bytes that were not UTF-8
    ],
)
def test_a_control_character_is_refused_naming_field_position_and_code(
    value: str, position: int, code: str
) -> None:
    with pytest.raises(AuditFieldError) as raised:
        audit_field("--by", value)
    message = str(raised.value)
    assert message.startswith(f"--by: character {position} is {code} ")
    assert "\n" not in message and value not in message


@pytest.mark.parametrize(
    "value",
    ["Zoë O'Brien", "运维组", "cli:alice", "क्\u200dष", "👩\u200d💻 dev", "x" * 500],
)
def test_ordinary_names_pass_unchanged(value: str) -> None:
    assert audit_field("--by", value) == value


def test_the_core_writers_refuse_before_writing(workspace: Workspace) -> None:
    """Every function that writes an audit row checks its fields itself (Python callers)."""
    catalog = workspace.catalog
    with pytest.raises(AuditFieldError, match=r"^reason: character 5 is U[+]000A"):
        add_tombstone(catalog, "record", "essays/e1", "gdpr\nforged")
    with pytest.raises(AuditFieldError, match=r"^target: character 10 is U[+]000D"):
        add_tombstone(catalog, "record", "essays/e1\r", "gdpr")
    with pytest.raises(AuditFieldError, match=r"^approved_by: character 2 is U[+]000A"):
        states.approve(catalog, SID, by="a\nb")
    with pytest.raises(AuditFieldError, match=r"^run_id: character 2 is U[+]001B"):
        take_permit(workspace.cas, catalog, SID, "r\x1b", "p")
    with pytest.raises(AuditFieldError, match=r"^purpose: character 2 is U[+]000A"):
        take_permit(workspace.cas, catalog, SID, "r", "p\n")
    item = benchmarks.BenchmarkItem("bench/1\n", "sha256:" + "1" * 64, "sha256:" + "2" * 64, "f")
    with pytest.raises(AuditFieldError, match=r"^item_id: character 8 is U[+]000A"):
        benchmarks.register(catalog, "bench", [item])
    with pytest.raises(AuditFieldError, match=r"^actor: character 4 is U[+]000A"):
        benchmarks.remove(catalog, "bench", None, actor="cli\nx")
    with catalog.begin() as conn:
        assert conn.scalar(select(func.count()).select_from(tombstones)) == 0
    assert benchmarks.summary(catalog) == []


def test_the_dagster_approval_config_refuses_a_forged_approver() -> None:
    with pytest.raises(ValueError, match=r"approver: character 6 is U[+]000A"):
        ApprovalConfig(approver="alice\nforged")
    with pytest.raises(AuditFieldError, match=r"dagster/user: character 2 is U[+]000A"):
        approver_identity("run-1", {"dagster/user": "e\nve"}, "alice")
    assert approver_identity("run-1", {}, "alice") == "dagster-run:run-1 claimed:alice"


def _run(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    clean.update(CORPUS_HOME=str(home / ".corpus"), DAGSTER_HOME=str(home / ".dagster"))
    clean.update(env or {})
    return subprocess.run(
        [CLI, *args], cwd=home, env=clean, capture_output=True, text=True, timeout=300
    )


def _refused(done: subprocess.CompletedProcess, field: str, position: int) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"corpus-assets: error: {field}: character {position} is U+")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_cli_refuses_every_audit_field_with_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """Through the real CLI on an empty home: each refusal names the flag and the position,
    before any catalog lookup (so the error is about the field, not the missing snapshot)."""
    _refused(_run(tmp_path, "approve", SID, "--by", FORGED), "--by", 6)
    tomb = ("tombstone", "add", "--record")
    _refused(_run(tmp_path, *tomb, "essays/e1", "--reason", "gdpr\r\nx"), "--reason", 5)
    _refused(_run(tmp_path, *tomb, "essays/e1\n", "--reason", "gdpr"), "--record", 10)
    read = ("read", SID, "--purpose", "p", "--run-id")
    _refused(_run(tmp_path, *read, "run\x1b[2J"), "--run-id", 4)
    _refused(
        _run(tmp_path, "export", "mds", SID, "--run-id", "r", "--purpose", "p\n", "--out", "o"),
        "--purpose",
        2,
    )
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "q\n1", "text": "What is two plus two?"}) + "\n")
    _refused(_run(tmp_path, "benchmark", "add", "b\u2028x", str(items)), "benchmark name", 2)
    added = _run(tmp_path, "benchmark", "add", "quiz", str(items))
    assert added.returncode == 1 and f"{items} line 1: id: character 2 is U+000A" in added.stderr
    _refused(_run(tmp_path, "benchmark", "remove", "quiz", "--item", "1\n"), "--item", 2)
    rolled = _run(tmp_path, "rollback", SID, env={"USER": "eve\nforged", "LOGNAME": "eve\nx"})
    _refused(rolled, "actor (login name)", 8)
    catalog = tmp_path / ".corpus" / "catalog.sqlite"
    if catalog.exists():  # nothing was written by any refused command
        with sqlite3.connect(catalog) as db:
            for table in ("tombstones", "benchmark_items", "permits", "snapshot_events"):
                assert db.execute(f"select count(*) from {table}").fetchone() == (0,)


def test_a_value_longer_than_its_column_is_refused_naming_the_limit(
    workspace: Workspace,
) -> None:
    """PostgreSQL would refuse it with a traceback (SQLite would store it): one line instead,
    from the catalog's own column widths."""
    catalog = workspace.catalog
    with pytest.raises(AuditFieldError, match=r"^target: 600 characters; at most 512 are kept"):
        add_tombstone(catalog, "record", "x" * 600, "gdpr")
    with pytest.raises(AuditFieldError, match=r"^approved_by: 129 characters; at most 128"):
        states.approve(catalog, SID, by="a" * 129)
    with pytest.raises(AuditFieldError, match=r"^run_id: 201 characters; at most 200"):
        take_permit(workspace.cas, catalog, SID, "r" * 201, "p")
    with pytest.raises(AuditFieldError, match=r"^benchmark: 129 characters; at most 128"):
        benchmarks.remove(catalog, "b" * 129, None, actor="cli:x")
    with catalog.begin() as conn:
        assert conn.scalar(select(func.count()).select_from(tombstones)) == 0


def test_history_shows_a_row_forged_before_the_fix_escaped_on_its_own_line(
    demo_home: Path,
) -> None:
    """A catalog written before audit fields were checked may hold a forged actor: ``history``
    prints it escaped (``\\n``), so it still cannot pass for a row of its own."""
    with open_workspace() as ws:
        states.register(ws.catalog, SID, "p1", "sha256:" + "1" * 64, "demo")
        with ws.catalog.begin() as conn:  # as an old release wrote it, unchecked
            conn.execute(
                insert(snapshot_events).values(
                    snapshot_id=SID,
                    from_state="BUILDING",
                    to_state="VALIDATED",
                    actor=FORGED,
                    detail="ok\x1b[2J",
                    at=time.time(),
                )
            )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run(
        [CLI, "history", "demo"], env=env, capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 3, shown.stdout  # the header, the registration, the old event
    assert "alice\\n2026-01-01" in lines[2] and "ok\\x1b[2J" in lines[2]
    assert "\x1b" not in shown.stdout
