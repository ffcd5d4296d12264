"""The splits layer's held-out search finds its members' canonical rows through the dedup
decisions table; the gate finds them itself.

Real builds on the demo home. The splits layer joins no records table on (record id, object,
line) for them (counted: the records-table rows such a join reads), and its bytes are those of
that join, which still runs without a decisions table. The gate does that join: it does not take
the build's decisions table on trust.
"""

from pathlib import Path
from typing import Any

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage import cas_queries
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.splits import build, build_splits, heldout
from corpus_assets.core.training_view.splits.heldout import HeldoutScan


def _counted(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Per search, the members' rows found; per join on strings, the records-table rows read."""
    found: list[int] = []
    joined: list[int] = []
    positions, join = HeldoutScan._positions, HeldoutScan._joined

    def counted_positions(self: HeldoutScan, *args: object) -> object:
        members = positions(self, *args)
        found.append(len(members.rows))
        return members

    def counted_join(self: HeldoutScan, *args: object) -> object:
        joined.append(sum(chunk.count for chunk in self.chunks))
        return join(self, *args)

    monkeypatch.setattr(HeldoutScan, "_positions", counted_positions)
    monkeypatch.setattr(HeldoutScan, "_joined", counted_join)
    return found, joined


def test_the_layer_joins_no_records_table_to_find_the_searched_rows_and_the_gate_does(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = open_workspace()
    built = build_all(ws, "p1")
    found, joined = _counted(monkeypatch)
    again = build_splits(ws, "p1")
    assert len(found) == 1 and found[0] > 0, found  # the layer's search
    assert joined == [], joined  # no records-table row read to find them
    assert again.digests == built["splits"].digests
    report = validate_snapshot(ws, built["manifest"].digest, trust_unchanged=True)
    assert report.ok, report.findings
    assert len(joined) == 1 and joined[0] >= found[0], joined  # the gate's own join
    joined.clear()

    monkeypatch.setattr(heldout, "row_order", lambda *_: None)  # no decisions table
    monkeypatch.setattr(build, "row_order", lambda *_: None)
    fallback = build_splits(ws, "p1")
    assert len(joined) == 1 and joined[0] >= found[0], joined
    assert fallback.digests == built["splits"].digests
    ws.close()


def test_the_held_out_search_runs_beside_only_the_assignment_it_reads(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The assignment's working tables (every member's component and key) are dropped and
    their pages handed back before the search: at 1.1 GB they were ~40 MB of the splits
    layer's peak, read by nothing after the assignment."""
    ws = open_workspace()
    built = build_all(ws, "p1")
    seen: list[set[str]] = []
    search = build._heldout

    def recorded(ws: Any, key: str, dedup: Any, con: Any, *rest: Any) -> Any:
        listed = con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        seen.append({row[0] for row in listed})
        return search(ws, key, dedup, con, *rest)

    monkeypatch.setattr(build, "_heldout", recorded)
    again = build_splits(ws, "p1")
    assert len(seen) == 1 and "assigned" in seen[0], seen
    assert not {"joined", "per"} & seen[0], seen
    assert again.digests == built["splits"].digests


def test_the_splits_layer_runs_under_its_own_cap_and_its_bytes_do_not_depend_on_it(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layer's connection is capped at ``SPLITS_LIMIT``, below the view's: the four phases
    of its peak each fill the cap, so the cap is what keeps its driver peak flat as the corpus
    grows (BENCHMARKS). Spilling sooner moves no byte."""
    ws = open_workspace()
    built = build_all(ws, "p1")
    caps: list[str] = []
    search = build._heldout

    def recorded(ws: Any, key: str, dedup: Any, con: Any, *rest: Any) -> Any:
        caps.append(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
        return search(ws, key, dedup, con, *rest)

    monkeypatch.setattr(build, "_heldout", recorded)
    build_splits(ws, "p1")
    with view_queries.connect() as wide, cas_queries.connect(view_queries.SPLITS_LIMIT) as own:
        expected = own.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        view = wide.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert caps == [expected] and expected != view, (caps, expected, view)
    monkeypatch.setattr(view_queries, "SPLITS_LIMIT", view_queries.MEMORY_LIMIT)
    assert build_splits(ws, "p1").digests == built["splits"].digests
    ws.close()
