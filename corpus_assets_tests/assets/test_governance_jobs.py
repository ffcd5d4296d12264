"""Tombstones and benchmarks from the UI, as jobs whose config is checked at launch.

The jobs run through Dagster (``execute_in_process`` on a real instance, the definitions the UI
loads) against the demo data home; what they record is read back from the real catalog.
"""

import json
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.core.governance import benchmarks, tombstones
from corpus_assets.core.governance.deletion_reach import revoked_targets
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.definitions import defs


def _run(
    job: str, config: dict, instance: dg.DagsterInstance, **kw: object
) -> dg.ExecuteInProcessResult:
    op = {
        "tombstone_add": "record_tombstone",
        "tombstone_lift": "lift_tombstone",
        "benchmark_add": "register_benchmark",
    }.get(job, "withdraw_benchmark")
    return defs.resolve_job_def(job).execute_in_process(
        run_config={"ops": {op: {"config": config}}}, instance=instance, **kw
    )


def test_a_tombstone_added_from_the_ui_revokes_its_target(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        result = _run(
            "tombstone_add",
            {"kind": "record", "target": "essays/e0001", "reason": "erasure request"},
            instance,
        )
    assert result.success
    seq = result.output_for_node("record_tombstone")
    with open_workspace() as ws:
        revoked = revoked_targets(ws.catalog, seq)
    assert revoked == {"record": {"essays/e0001": f"tombstone {seq} (record 'essays/e0001')"}}


def test_a_tombstone_lifted_from_the_ui_is_withdrawn_once_and_names_the_run(
    demo_home: Path,
) -> None:
    with dg.instance_for_test() as instance:
        added = _run(
            "tombstone_add",
            {"kind": "record", "target": "essays/e0001", "reason": "erasure request"},
            instance,
        )
        seq = added.output_for_node("record_tombstone")
        lifted = _run("tombstone_lift", {"seq": seq, "reason": "request withdrawn"}, instance)
        assert lifted.success
        lift = lifted.output_for_node("lift_tombstone")
        again = _run(
            "tombstone_lift", {"seq": seq, "reason": "twice"}, instance, raise_on_error=False
        )
    assert _failure(again) == f"tombstone {seq} was lifted already by {lift}; nothing lifted"
    with open_workspace() as ws:
        assert revoked_targets(ws.catalog, lift) == {}
        shown = tombstones.entry(ws.catalog, lift)
    assert shown is not None and shown["actor"] == f"dagster-run:{lifted.run_id}"
    assert (shown["lifts"], shown["reason"]) == (seq, "request withdrawn")


def test_a_lift_without_a_number_is_refused_before_the_run_starts(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError):
            _run("tombstone_lift", {"reason": "no number"}, instance)
        assert instance.get_runs() == []


def test_a_kind_outside_the_choices_is_refused_before_the_run_starts(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError):
            _run("tombstone_add", {"kind": "snapshot", "target": "e", "reason": "x"}, instance)
        assert instance.get_runs() == []  # the config schema: no run at all


@pytest.mark.parametrize(
    ("target", "said"),
    [
        (
            "essays/e0001\nforged",
            "config field 'target': character 13 is U+000A (LINE FEED)",
        ),  # a forged audit line
        ("  ", "config field 'target' is empty"),
    ],
)
def test_a_bad_tombstone_target_fails_the_run_in_one_line_and_records_nothing(
    demo_home: Path, target: str, said: str
) -> None:
    config = {"kind": "record", "target": target, "reason": "x"}
    with dg.instance_for_test() as instance:
        result = _run("tombstone_add", config, instance, raise_on_error=False)
    assert not result.success
    assert said in _failure(result)
    with open_workspace() as ws:
        assert revoked_targets(ws.catalog, 1 << 30) == {}


def _failure(result: dg.ExecuteInProcessResult) -> str:
    """The run's one step failure: a ``Failure`` whose description is the refusal."""
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data.user_failure_data is not None, data.error  # a Failure, not a stack trace
    description = data.user_failure_data.description or ""
    assert "\n" not in description
    return description


def _foreign_jsonl(path: Path) -> Path:
    """A benchmark file as another tool writes it: CRLF line ends, raw UTF-8 (no escapes),
    integer and string ids, a blank last line."""
    rows = [
        {"id": 1, "text": "Quelle est la capitale ? Réponse : Paris."},
        {"id": "q2", "text": "日本の首都は東京です。"},
    ]
    path.write_bytes(
        b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\r\n" for r in rows) + b"\r\n"
    )
    return path


def test_a_benchmark_written_by_another_tool_registers_and_withdraws_from_the_ui(
    demo_home: Path, tmp_path: Path
) -> None:
    file = _foreign_jsonl(tmp_path / "quiz.jsonl")
    with dg.instance_for_test() as instance:
        added = _run("benchmark_add", {"name": "quiz", "file": str(file)}, instance)
        assert added.success and added.output_for_node("register_benchmark") == 2
        with open_workspace() as ws:
            (row,) = benchmarks.summary(ws.catalog)
        assert (row["benchmark"], row["items"]) == ("quiz", 2)
        removed = _run("benchmark_remove", {"name": "quiz", "items": ["q2"]}, instance)
        assert removed.success and removed.output_for_node("withdraw_benchmark") == 1
    with open_workspace() as ws:
        (row,) = benchmarks.summary(ws.catalog)
    assert (row["benchmark"], row["items"]) == ("quiz", 1)


def test_a_bad_benchmark_line_fails_the_run_naming_it_and_registers_nothing(
    demo_home: Path, tmp_path: Path
) -> None:
    file = tmp_path / "broken.jsonl"
    file.write_text('{"id": 1, "text": "fine"}\n{"id": 2, "txt": "misspelt field"}\n')
    with dg.instance_for_test() as instance:
        result = _run(
            "benchmark_add", {"name": "quiz", "file": str(file)}, instance, raise_on_error=False
        )
    assert not result.success
    message = _failure(result)
    assert message == f"{file} line 2: field 'text' is missing", message
    with open_workspace() as ws:
        assert benchmarks.summary(ws.catalog) == []
