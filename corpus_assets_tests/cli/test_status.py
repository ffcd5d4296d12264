"""``corpus-assets status`` stays a screen long however long a home's history: every snapshot
still in play, the newest ended ones, and a count of the older ended ones (a daily build whose
retention ends one snapshot a day would otherwise list every day of the year)."""

from typing import Any

from corpus_assets.cli.commands.status import ENDED_SHOWN, status_lines


def _snapshot(n: int, state: str, current: bool = False) -> dict[str, Any]:
    return {
        "snapshotId": f"sha256:{n:064x}",
        "partition": f"snap-{n:04d}",
        "alias": "daily",
        "state": state,
        "current": current,
        "approvedBy": None,
        "createdAt": f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}Z",
        "reason": "removed by gc" if state == "EXPIRED" else None,
    }


def _payload(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "home": "/h",
        "catalog": "sqlite:///c",
        "aliases": [],
        "snapshots": snapshots,
        "unfinished": [],
    }


def test_older_ended_snapshots_become_one_count_line() -> None:
    history = [_snapshot(n, "REJECTED" if n == 3 else "EXPIRED") for n in range(40)]
    history += [_snapshot(40, "ACTIVE", current=True), _snapshot(41, "VALIDATED")]
    shown = "\n".join(status_lines(_payload(history)))
    listed = [s for s in history if s["snapshotId"] in shown]
    assert listed == history[-ENDED_SHOWN - 2 :]  # the newest ended ones, and what is in play
    assert "... and 30 older ended snapshots (EXPIRED 29, REJECTED 1): " in shown
    assert "`corpus-assets status --all` (or --json) lists every one" in shown

    every = "\n".join(status_lines(_payload(history), show_all=True))
    assert all(s["snapshotId"] in every for s in history) and "older ended" not in every


def test_a_short_history_is_listed_whole() -> None:
    history = [_snapshot(n, "EXPIRED") for n in range(ENDED_SHOWN)]
    history.append(_snapshot(ENDED_SHOWN, "ACTIVE", current=True))
    assert status_lines(_payload(history)) == status_lines(_payload(history), show_all=True)
    assert "older ended" not in "\n".join(status_lines(_payload(history)))
