"""The held-out gate of a child whose parent passed it looks up the rows of the changed records
and of their candidates only, not every member's, and finds the pairs the narrowed search over
every member's row finds (a leak planted on a changed record included)."""

from pathlib import Path

import pytest

from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.training_view.splits import HeldoutScan, narrowed_pairs
from corpus_assets_tests.core.publication.test_child_check import (
    SQLITE,
    _changed_search,
    _parent_and_child,
)


@SQLITE
def test_the_narrowed_gate_finds_no_members_row_but_the_changed_and_their_candidates(
    workspace: Workspace, demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, child = _parent_and_child(workspace, demo_home)
    positions: list[int] = []
    found = HeldoutScan._positions

    def counted(self: HeldoutScan, *args: object) -> object:
        members = found(self, *args)
        positions.append(len(members.rows))
        return members

    monkeypatch.setattr(HeldoutScan, "_positions", counted)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok and "heldout_near_apart" in report.rules_narrowed, report.findings
    assert positions == [], positions  # no join of every member's row

    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        scan, records, changed = _changed_search(workspace, ev)
        # a changed record in train beside its unchanged held-out near twin, as it stands
        # and moved: the pairs of the search over every member's row, in the same order
        wide = scan.pairs(ev.con, records, keep=False, changed=changed)[0].to_pylist()
        ids = set(changed.to_pylist())
        pair = next(p for p in wide if (p["record_a"] in ids) != (p["record_b"] in ids))
        moved = pair["record_a"] if pair["record_a"] in ids else pair["record_b"]
        tampered = (
            "SELECT record_id, object, line, leakage_id, CASE WHEN record_id = "
            f"'{moved}' THEN 'train' ELSE split END AS split FROM ({records})"
        )
        for members in (records, tampered):
            wide = scan.pairs(ev.con, members, keep=False, changed=changed)[0].to_pylist()
            narrow, stats = narrowed_pairs(scan, ev.con, members, None, changed)
            assert narrow.to_pylist() == wide and wide
            assert stats["changed"] == len(changed), stats
            assert 0 < stats["tables_read"] < len(scan.chunks), stats  # those of the changed
            assert stats["looked_up"] < ev.member_count // 2, (stats, ev.member_count)
        assert any(p["split_a"] != p["split_b"] for p in narrow.to_pylist())


def test_row_keys_are_the_plain_read_of_the_rows_taken(tmp_path: Path) -> None:
    """The narrowed search's key lookup reads each object as its dictionary and decodes only
    the rows taken: the same row, record_id, object (a plain string), line as a plain read."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpus_assets.core.training_view.splits.heldout_narrowed import _row_keys

    paths, tables = [], []
    for n, rows in enumerate((5, 3, 4)):
        table = pa.table(
            {
                "record_id": [f"r{n}-{i}" for i in range(rows)],
                "object": [f"sha256:{n % 2}{i % 2}" for i in range(rows)],
                "line": pa.array(range(rows), pa.int64()),
                "text": ["x" * i for i in range(rows)],
            }
        )
        paths.append(str(tmp_path / f"t{n}.parquet"))
        pq.write_table(table, paths[-1])
        tables.append(table.drop_columns(["text"]))
    rows = np.array([1, 4, 9, 11], np.int64)  # none of the middle table's
    keys = _row_keys(paths, [0, 5, 8], rows)
    whole = pa.concat_tables(tables)
    plain = whole.take(pa.array(rows)).add_column(0, "row", pa.array(rows))
    assert keys.schema.field("object").type == pa.string()
    assert keys.to_pylist() == plain.to_pylist()


@SQLITE
def test_the_heldout_and_leakage_rules_leave_no_table_to_the_eviction_between_rules(
    workspace: Workspace, demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held-out rule's searched records and the leakage rule's live rows are dropped when
    the rule ends: the check's eviction between rules would write them to its spill directory."""
    _, child = _parent_and_child(workspace, demo_home)
    left: list[str] = []
    evict = Evidence.evict

    def listed(self: Evidence) -> None:
        if self._con is not None:
            tables = self._con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary")
            left.extend(name for (name,) in tables.fetchall())
        evict(self)

    monkeypatch.setattr(Evidence, "evict", listed)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    ran = {"heldout_near_apart", "dedup_invariants_hold"} - set(report.rules_reused)
    assert report.ok and ran == {"heldout_near_apart", "dedup_invariants_hold"}, report.findings
    assert not {"ho_searched", "ho_objects", "dd_live"} & set(left), left
