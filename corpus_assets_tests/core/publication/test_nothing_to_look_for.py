"""The rules that look a few ids or keys up among every member's (quarantined records, active
benchmark items) answer at once when there are none: no join with the members table runs."""

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from corpus_assets.core.publication import rules
from corpus_assets.core.publication.rules import RuleReport


def _members_read(*_args: Any) -> Any:
    raise AssertionError("the members table was read")


def _evidence(quarantined: list[str]) -> Any:
    return SimpleNamespace(
        split_conflicts=pa.table({"component": pa.array([], pa.int64())}),
        quarantined=quarantined,
        register=lambda *_: None,
        rows=_members_read,
        catalog=SimpleNamespace(begin=nullcontext),
        manifest=SimpleNamespace(benchmark_seq=7),
    )


def test_no_quarantined_record_reads_no_member() -> None:
    report = RuleReport()
    assert rules.split_conflicts_resolved(_evidence([]), report) == []
    assert (report.split_conflicts, report.split_quarantined) == (0, 0)
    with pytest.raises(AssertionError, match="members table was read"):  # one to look for
        rules.split_conflicts_resolved(_evidence(["r1"]), RuleReport())


def test_no_active_benchmark_item_reads_no_member(monkeypatch: pytest.MonkeyPatch) -> None:
    items: list[Any] = []
    monkeypatch.setattr(rules, "active_items", lambda _conn, _fence: items)
    report = RuleReport()
    assert rules.no_benchmark_hits(_evidence([]), report) == []
    assert report.benchmark_hits == 0
    items.append(SimpleNamespace(benchmark="b", dedup_key="k"))
    with pytest.raises(AssertionError, match="members table was read"):
        rules.no_benchmark_hits(_evidence([]), RuleReport())
