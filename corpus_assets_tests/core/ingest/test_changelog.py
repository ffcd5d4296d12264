"""CDC changelog fold: op semantics, watermark, gaps, late events, determinism, refusals."""

import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import rfc8785
import zstandard

from corpus_assets.core.ingest.changelog import (
    ChangelogError,
    FoldResult,
    fold,
    head_offset,
    late_events,
    list_segments,
)
from corpus_assets.core.ingest.changelog.events import canonical_event, load_event
from corpus_assets.core.ingest.changelog.segments import DEFAULT_INCLUDE
from corpus_assets.core.storage.digests import canonical_foreign_json

WHAT = "source 'orders'"


def c(lsn: Any, key: Any, **fields: Any) -> dict[str, Any]:
    return {"op": "c", "before": None, "after": {"id": key, **fields}, "source": {"lsn": lsn}}


def r(lsn: Any, key: Any, **fields: Any) -> dict[str, Any]:
    return {"op": "r", "before": None, "after": {"id": key, **fields}, "source": {"lsn": lsn}}


def u(lsn: Any, key: Any, old: Any = None, **fields: Any) -> dict[str, Any]:
    before = None if old is None else {"id": old}
    return {"op": "u", "before": before, "after": {"id": key, **fields}, "source": {"lsn": lsn}}


def d(lsn: Any, key: Any) -> dict[str, Any]:
    return {"op": "d", "before": {"id": key}, "after": None, "source": {"lsn": lsn}}


def encode(lines: list[Any], codec: str) -> bytes:
    data = b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )
    if codec == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    if codec == "gzip":
        return gzip.compress(data, mtime=0)
    return data


def write(folder: Path, name: str, lines: list[Any], codec: str | None = None) -> Path:
    if codec is None:
        codec = {"zst": "zstd", "gz": "gzip"}.get(name.rsplit(".", 1)[-1], "plain")
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(lines, codec))
    return path


def fold_dir(folder: Path, **kwargs: Any) -> FoldResult:
    return fold(list_segments(folder, DEFAULT_INCLUDE), key_field="id", what=WHAT, **kwargs)


def late(folder: Path, frozen: FoldResult, **kwargs: Any) -> list[str]:
    record = frozen.freeze_record()  # what a freeze spec stores: decimal strings
    return late_events(
        list_segments(folder, DEFAULT_INCLUDE),
        watermark=record["watermark"],
        events_digest=record["eventsDigest"],
        gaps=record["gaps"],
        segments_at_freeze=record["segments"],
        key_field="id",
        what=WHAT,
        **kwargs,
    )


def logical(result: FoldResult) -> dict[str, Any]:
    """Everything except the segment listing, which names files by design."""
    return {k: v for k, v in vars(result).items() if k != "segments"}


def test_ops_fold_to_table_state(tmp_path: Path) -> None:
    write(
        tmp_path,
        "seg-001.jsonl.zst",
        [
            r(1, 1, text="snapshot one"),
            r(2, 2, text="snapshot two"),
            c(3, 3, text="created"),
            u(4, 1, old=1, text="one updated"),
            d(5, 2),
            u(6, 3, text="updated without before image"),
            c(7, 4, text="created then deleted"),
            d(8, 4),
            d(9, 99),  # deleting an absent key leaves the state unchanged
        ],
    )
    result = fold_dir(tmp_path)
    assert result.rows == [
        {"id": 1, "text": "one updated"},
        {"id": 3, "text": "updated without before image"},
    ]
    assert (result.watermark, result.first_lsn, result.events) == (9, 1, 9)
    assert result.complete and result.gaps == [] and result.after_watermark == 0
    assert result.duplicates == []


def test_update_that_changes_the_key_deletes_the_old_key(tmp_path: Path) -> None:
    write(tmp_path, "s.jsonl.zst", [c(1, "a", v="x"), c(2, "b", v="y"), u(3, "z", old="a", v="x")])
    assert fold_dir(tmp_path).rows == [{"id": "b", "v": "y"}, {"id": "z", "v": "x"}]


def test_keys_are_stringified_and_sorted_in_the_stated_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        "s.jsonl.zst",
        [c(1, "b"), c(2, 10), c(3, 2), c(4, "a"), c(5, -3), c(6, "2", v="int and str 2 are one")],
    )
    keys = [row["id"] for row in fold_dir(tmp_path).rows]
    assert keys == [-3, "2", 10, "a", "b"]


def test_events_after_the_watermark_are_excluded_and_counted(tmp_path: Path) -> None:
    write(tmp_path, "s.jsonl.zst", [c(i, i) for i in range(1, 9)] + [d(9, 1)])
    result = fold_dir(tmp_path, watermark=5)
    assert result.watermark == 5 and result.events == 5 and result.after_watermark == 4
    assert [row["id"] for row in result.rows] == [1, 2, 3, 4, 5]
    assert fold_dir(tmp_path, watermark="5") == result  # a freeze spec's decimal string
    now = fold_dir(tmp_path)
    assert (now.watermark, now.events, now.after_watermark) == (9, 9, 0)
    assert now.events_digest != result.events_digest


def test_gap_is_reported_exactly(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2), c(3, 3)])
    write(tmp_path, "b.jsonl.zst", [c(7, 7), c(8, 8)])
    result = fold_dir(tmp_path)
    assert result.gaps == [(4, 6)] and not result.complete
    assert (result.watermark, result.events) == (8, 5)
    assert fold_dir(tmp_path, start_lsn=0).gaps == [(0, 0), (4, 6)]
    assert fold_dir(tmp_path, watermark=10).gaps == [(4, 6), (9, 10)]


def test_late_event_filling_a_gap_is_detected(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2), c(3, 3)])
    write(tmp_path, "b.jsonl.zst", [c(7, 7), c(8, 8)])
    frozen = fold_dir(tmp_path)
    assert late(tmp_path, frozen) == []
    write(tmp_path, "c.jsonl.zst", [c(5, 5)])
    findings = late(tmp_path, frozen)
    assert findings[0] == (
        f"{WHAT}: late CDC events at or below watermark 8: lsn 5 arrived after the freeze"
    )
    assert "events digest" in findings[-1]
    write(tmp_path, "d.jsonl.zst", [c(4, 4), c(6, 6)])
    assert "lsn 4..6 arrived after the freeze" in late(tmp_path, frozen)[0]


def test_rewritten_old_event_in_a_new_segment_is_detected(tmp_path: Path) -> None:
    write(tmp_path, "seg-1.jsonl.zst", [c(i, i, v="orig") for i in range(1, 11)])
    frozen = fold_dir(tmp_path)
    write(tmp_path, "seg-2.jsonl.zst", [c(3, 3, v="orig")])  # at-least-once redelivery
    assert late(tmp_path, frozen) == []
    write(tmp_path, "seg-3.jsonl.zst", [u(3, 3, v="changed")])
    findings = late(tmp_path, frozen)
    assert len(findings) == 1
    assert "watermark 10: lsn 3 was rewritten" in findings[0]
    assert "seg-3.jsonl.zst line 1" in findings[0]


def test_old_events_that_vanished_are_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2)])
    write(tmp_path, "b.jsonl.zst", [c(3, 3), c(4, 4)])
    frozen = fold_dir(tmp_path)
    (tmp_path / "a.jsonl.zst").unlink()
    findings = late(tmp_path, frozen)
    assert any("lsn 1..2 present at the freeze are missing now" in f for f in findings)
    assert any("segment a.jsonl.zst read at the freeze is gone" in f for f in findings)


def test_event_rewritten_in_place_names_the_segment(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl", [c(1, 1, v="x"), c(2, 2)])
    write(tmp_path, "b.jsonl", [c(3, 3)])
    frozen = fold_dir(tmp_path)
    write(tmp_path, "a.jsonl", [c(1, 1, v="y"), c(2, 2)])
    findings = late(tmp_path, frozen)
    assert findings[0] == (
        f"{WHAT}: CDC events at or below watermark 3 changed after the freeze: "
        "segment a.jsonl was rewritten: its first 150 bytes changed"
    )
    assert "events digest" in findings[1] and len(findings) == 2


def test_late_events_with_only_the_digest_still_reports_the_change(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2), c(4, 4)])
    frozen = fold_dir(tmp_path)
    segments = list_segments(tmp_path, DEFAULT_INCLUDE)
    call = {"watermark": 4, "events_digest": frozen.events_digest, "key_field": "id", "what": WHAT}
    assert late_events(segments, **call) == []
    write(tmp_path, "b.jsonl.zst", [c(3, 3)])
    findings = late_events(list_segments(tmp_path, DEFAULT_INCLUDE), **call)
    assert len(findings) == 1 and "events digest" in findings[0]


def test_refold_is_identical_and_later_events_are_not_late(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1, t="x"), u(2, 1, t="y"), c(3, 2, t="z")])
    frozen = fold_dir(tmp_path)
    again = fold_dir(tmp_path, watermark=frozen.watermark)
    assert again == frozen
    write(tmp_path, "b.jsonl.zst", [d(4, 1), c(5, 3)])  # the next snapshot's events
    assert late(tmp_path, frozen) == []
    refold = fold_dir(tmp_path, watermark=frozen.watermark)
    assert (refold.events_digest, refold.rows) == (frozen.events_digest, frozen.rows)
    assert refold.after_watermark == 2


def test_same_events_across_one_or_three_segments_give_identical_results(tmp_path: Path) -> None:
    events = [c(1, 1, t="a"), c(2, 2, t="b"), u(3, 2, t="c"), c(4, 3), d(5, 1)]
    events += [c(6, 4), u(7, 5, old=4), c(8, 6, n=2**60), r(9, 7), d(10, 6)]
    one, three = tmp_path / "one", tmp_path / "three"
    write(one, "all.jsonl.zst", events)
    # names sort opposite to log order and codecs differ: only lsn decides
    write(three, "z.jsonl.zst", events[:4])
    write(three, "m/part.jsonl.gz", events[4:7])
    write(three, "a.jsonl", events[7:])
    a, b = fold_dir(one), fold_dir(three)
    assert logical(a) == logical(b)
    assert [s["name"] for s in b.segments] == ["a.jsonl", "m/part.jsonl.gz", "z.jsonl.zst"]
    assert [row["id"] for row in a.rows] == [2, 3, 5, 7]


def test_unsorted_segment_is_folded_in_lsn_order(tmp_path: Path) -> None:
    events = [c(1, 1, t="a"), u(2, 1, t="b"), u(3, 1, t="c"), d(4, 1), c(5, 1, t="d")]
    write(tmp_path / "sorted", "s.jsonl", events)
    write(tmp_path / "shuffled", "s.jsonl", [events[i] for i in (3, 0, 4, 2, 1)])
    write(tmp_path / "shuffled", "t.jsonl.zst", [c(6, 2)])
    write(tmp_path / "sorted", "t.jsonl.zst", [c(6, 2)])
    a, b = fold_dir(tmp_path / "sorted"), fold_dir(tmp_path / "shuffled")
    assert logical(a) == logical(b)
    assert a.rows == [{"id": 1, "t": "d"}, {"id": 2}]


def test_identical_duplicates_are_counted_and_lsn_forms_agree(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2)])
    write(tmp_path, "b.jsonl.zst", [c("2", 2), c(3, 3)])  # "2" and 2 are the same offset
    result = fold_dir(tmp_path)
    assert result.duplicates == [2] and result.events == 3 and result.complete


def test_conflicting_duplicate_raises_naming_both_places(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(1, 1), c(2, 2, v="x")])
    write(tmp_path, "b.jsonl.zst", [c(2, 2, v="y")])
    with pytest.raises(ChangelogError, match="lsn 2 was rewritten") as error:
        fold_dir(tmp_path)
    assert "a.jsonl.zst line 2" in str(error.value) and "b.jsonl.zst line 1" in str(error.value)


def test_lsn_below_start_raises(tmp_path: Path) -> None:
    write(tmp_path, "a.jsonl.zst", [c(4, 1), c(5, 2)])
    with pytest.raises(ChangelogError, match=r"a\.jsonl\.zst line 1: lsn 4 is below start_lsn 5"):
        fold_dir(tmp_path, start_lsn=5)
    assert fold_dir(tmp_path, start_lsn=4).complete


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b'{"op": "c", "after": {"id": 2}, "source": {"lsn": 2}', "not a JSON event"),
        (b"\xff\xfe", "not a JSON event"),
        (b"[1, 2]", "not an object"),
        ({"op": "x", "after": {"id": 2}, "source": {"lsn": 2}}, "unknown op 'x'"),
        ({"after": {"id": 2}, "source": {"lsn": 2}}, "unknown op None"),
        ({"op": "c", "after": {"name": "n"}, "source": {"lsn": 2}}, "no key field 'id'"),
        ({"op": "c", "after": {"id": True}, "source": {"lsn": 2}}, "after.id is bool"),
        ({"op": "c", "after": {"id": 2.0}, "source": {"lsn": 2}}, "after.id is float"),
        ({"op": "c", "after": {"id": 2}, "source": {"lsn": "2a"}}, "source.lsn '2a'"),
        ({"op": "c", "after": {"id": 2}, "source": {"lsn": 2.0}}, "source.lsn 2.0"),
        ({"op": "c", "after": {"id": 2}, "source": {"lsn": True}}, "source.lsn True"),
        ({"op": "c", "after": {"id": 2}, "source": {"lsn": -2}}, "source.lsn -2"),
        ({"op": "c", "after": {"id": 2}, "source": {}}, "no source.lsn"),
        ({"op": "c", "before": None, "after": None, "source": {"lsn": 2}}, "after is NoneType"),
        ({"op": "d", "before": None, "after": None, "source": {"lsn": 2}}, "before is NoneType"),
        ({"op": "u", "before": {"x": 1}, "after": {"id": 2}, "source": {"lsn": 2}}, "before has"),
        (b'{"op": "c", "after": {"id": 2, "v": NaN}, "source": {"lsn": 2}}', "NaN is not JSON"),
        (b'{"op": "c", "op": "d", "after": {"id": 2}, "source": {"lsn": 2}}', "duplicate member"),
        (b'{"op": "c", "after": {"id": 2, "t": "\\ud800"}, "source": {"lsn": 2}}', "canonicalize"),
        (b'{"op": "c", "after": {"id": 2, "t": 1e400}, "source": {"lsn": 2}}', "canonicalize"),
    ],
)
def test_malformed_event_raises_naming_source_segment_and_line(
    tmp_path: Path, bad: Any, message: str
) -> None:
    write(tmp_path, "seg-01.jsonl.zst", [c(1, 1), bad, c(3, 3)])
    with pytest.raises(ChangelogError, match="line") as error:
        fold_dir(tmp_path)
    text = str(error.value)
    assert text.startswith(f"{WHAT}: segment seg-01.jsonl.zst line 2: ")
    assert message in text


def test_corrupt_zstd_segment_raises_naming_segment(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(40)))
    with pytest.raises(ChangelogError, match=r"segment bad\.jsonl\.zst: corrupt zstd data"):
        fold_dir(tmp_path)


def test_truncated_zstd_segment_raises_naming_it(tmp_path: Path) -> None:
    data = encode([c(i, i, t="x" * 50) for i in range(1, 200)], "zstd")
    (tmp_path / "a.jsonl.zst").write_bytes(data[: len(data) // 2])
    write(tmp_path, "b.jsonl.zst", [c(200, 200)])
    with pytest.raises(ChangelogError, match=r"segment a\.jsonl\.zst: zstd stream is truncated"):
        fold_dir(tmp_path)


def test_multi_frame_zstd_gzip_and_plain_segments(tmp_path: Path) -> None:
    frames = encode([c(1, 1), c(2, 2)], "zstd") + encode([u(3, 1, t="appended frame")], "zstd")
    (tmp_path / "a.jsonl.zst").write_bytes(frames)
    write(tmp_path, "b.jsonl.gz", [c(4, 4)])
    write(tmp_path, "c.jsonl", [c(5, 5), b"", b"  "])
    write(tmp_path, "ignored.json", [c(6, 6)])
    result = fold_dir(tmp_path)
    assert [row["id"] for row in result.rows] == [1, 2, 4, 5]
    assert result.rows[0] == {"id": 1, "t": "appended frame"}
    assert result.watermark == 5 and result.complete
    assert result.segments[0] == {
        "name": "a.jsonl.zst",
        "sha256": "sha256:" + hashlib.sha256(frames).hexdigest(),
        "size": len(frames),
    }


def test_fold_reads_only_the_listed_bytes_of_a_live_segment(tmp_path: Path) -> None:
    path = write(tmp_path, "live.jsonl", [c(1, 1), c(2, 2)])
    original = path.read_bytes()
    segments = list_segments(tmp_path, DEFAULT_INCLUDE)
    with path.open("ab") as handle:  # the writer appends after the listing
        handle.write(encode([c(3, 3)], "plain"))
    result = fold(segments, key_field="id", what=WHAT)
    assert result.watermark == 2 and result.events == 2
    assert result.segments[0]["sha256"] == "sha256:" + hashlib.sha256(original).hexdigest()
    assert head_offset(segments) == 2
    path.write_bytes(original[:10])
    with pytest.raises(ChangelogError, match=r"live\.jsonl is shorter than the"):
        fold(segments, key_field="id", what=WHAT)


LINE_8 = json.dumps(c(8, 8)).encode()


@pytest.mark.parametrize("written", [20, len(LINE_8)])  # cut mid-event; whole but no newline
def test_a_half_written_last_line_waits_for_the_next_fold(tmp_path: Path, written: int) -> None:
    """A line without its newline is not written yet, parseable or not: the fold stops before
    it (the frozen size and sha256 are of the lines before it) and names the bytes left; once
    the writer ends the line, the next fold has it exactly once and nothing frozen is late."""
    done = encode([c(6, 6), c(7, 7)], "plain")
    path = tmp_path / "live.jsonl"
    path.write_bytes(done + LINE_8[:written])
    write(tmp_path, "old.jsonl.zst", [c(i, i) for i in range(1, 6)])
    frozen = fold_dir(tmp_path)
    assert (frozen.watermark, frozen.events, frozen.after_watermark) == (7, 7, 0)
    assert [row["id"] for row in frozen.rows] == [1, 2, 3, 4, 5, 6, 7]
    assert frozen.segments[0] == {
        "name": "live.jsonl",
        "sha256": "sha256:" + hashlib.sha256(done).hexdigest(),
        "size": len(done),
        "pendingBytes": written,
    }
    assert head_offset(list_segments(tmp_path, DEFAULT_INCLUDE)) == 7
    with path.open("ab") as handle:  # the writer finishes the line
        handle.write(LINE_8[written:] + b"\n")
    assert late(tmp_path, frozen) == []
    later = fold_dir(tmp_path)
    assert (later.watermark, later.events, later.duplicates) == (8, 8, [])
    assert [row["id"] for row in later.rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert later.segments[0]["size"] == path.stat().st_size
    assert "pendingBytes" not in later.segments[0]
    assert head_offset(list_segments(tmp_path, DEFAULT_INCLUDE)) == 8


def test_a_segment_with_no_whole_line_yet_folds_as_empty(tmp_path: Path) -> None:
    (tmp_path / "new.jsonl").write_bytes(b'{"op": "c", "af')
    write(tmp_path, "a.jsonl", [c(1, 1)])
    result = fold_dir(tmp_path)
    assert (result.watermark, result.events) == (1, 1)
    assert result.segments[1] == {
        "name": "new.jsonl",
        "sha256": "sha256:" + hashlib.sha256(b"").hexdigest(),
        "size": 0,
        "pendingBytes": 15,
    }


@pytest.mark.parametrize(("codec", "name"), [("zstd", "a.jsonl.zst"), ("gzip", "a.jsonl.gz")])
def test_a_compressed_segment_is_whole_frames_and_a_cut_frame_is_corruption(
    tmp_path: Path, codec: str, name: str
) -> None:
    """A compressed segment is written whole (its unit is the frame or member, not the line):
    its last line counts with or without a newline, and a frame cut short is corruption, not a
    pending write, since a truncated stream cannot tell a writer mid-frame from damage."""
    last = json.dumps(c(2, 2)).encode()  # no newline after it
    one = encode([c(1, 1)], codec)
    frames = one + (
        zstandard.ZstdCompressor().compress(last) if codec == "zstd" else gzip.compress(last, 0)
    )
    (tmp_path / name).write_bytes(frames)
    result = fold_dir(tmp_path)
    assert (result.watermark, result.events) == (2, 2)
    assert result.segments[0]["size"] == len(frames) and "pendingBytes" not in result.segments[0]
    assert head_offset(list_segments(tmp_path, DEFAULT_INCLUDE)) == 2
    (tmp_path / name).write_bytes(frames[:-3])
    with pytest.raises(
        ChangelogError, match=rf"segment {re.escape(name)}: {codec} stream is trunc"
    ):
        fold_dir(tmp_path)


def test_head_offset_is_the_max_lsn_whatever_the_names(tmp_path: Path) -> None:
    assert head_offset(list_segments(tmp_path, DEFAULT_INCLUDE)) is None
    write(tmp_path, "empty.jsonl", [])
    assert head_offset(list_segments(tmp_path, DEFAULT_INCLUDE)) is None
    write(tmp_path, "b.jsonl.zst", [c(1, 1), c(2, 2)])
    # a plain segment whose last event is longer than the tail block, then blank CRLF lines
    (tmp_path / "a.jsonl").write_bytes(
        encode([c(3, 3), c(4, 4, t="x" * 200_000)], "plain") + b"\r\n\r\n"
    )
    write(tmp_path, "c.jsonl.gz", [c(5, 5)])
    write(tmp_path, "d.jsonl", [c("9007199254740993", 6)])
    segments = list_segments(tmp_path, DEFAULT_INCLUDE)
    assert head_offset([s for s in segments if s.name != "d.jsonl"]) == 5
    assert head_offset([s for s in segments if s.name == "a.jsonl"]) == 4
    assert head_offset(segments) == 9007199254740993
    # a writer mid-line: the unterminated tail is not present yet, for the head as for the fold
    torn = encode([c(7, 7)], "plain") + b'{"op": "c", "after": {"id": 8}, "sou'
    (tmp_path / "e.jsonl").write_bytes(torn)
    segments = list_segments(tmp_path, DEFAULT_INCLUDE)
    assert head_offset(segments) == 9007199254740993
    assert head_offset([s for s in segments if s.name == "e.jsonl"]) == 7
    (tmp_path / "e.jsonl").write_bytes(torn + b"\n")  # ended: a line that is not an event
    with pytest.raises(ChangelogError, match=r"segment e\.jsonl line at byte 70: not a JSON"):
        head_offset(list_segments(tmp_path, DEFAULT_INCLUDE), what=WHAT)


def test_big_integers_floats_and_string_lsns(tmp_path: Path) -> None:
    base = 2**62
    write(
        tmp_path,
        "s.jsonl.zst",
        [c(str(base), 2**60, price=1.5), c(str(base + 1), 7, price=2), u(str(base + 2), 7, v=0.1)],
    )
    result = fold_dir(tmp_path, start_lsn=base)
    assert result.complete and (result.first_lsn, result.watermark) == (base, base + 2)
    assert [row["id"] for row in result.rows] == [7, 2**60]
    assert result.freeze_record()["watermark"] == str(base + 2)
    assert late(tmp_path, result, start_lsn=base) == []


@pytest.mark.parametrize(
    "line",
    [
        '{"z": [1, "\u00e9\\"q\\"", null, true, false], "a": {"\\t\\u0001\\u007f": -3}}',
        '{"s": "\u2028\u2029 \U0001f600 \\b\\f\\n\\r\\t \\u001f", "n": [0, -0, 9007199254740991]}',
        '{"big": 1152921504606846976, "neg": -1152921504606846976}',
        '{"f": 0.1, "g": 1e21, "h": 1E-7, "i": 100.0, "j": -0.0}',
        '{"\u00e9": 1, "e": 2, "\uff61": 3, "\U0001f600": 4}',
    ],
)
def test_canonical_event_bytes_are_rfc8785(line: str) -> None:
    body, plain = load_event(line.encode(), WHAT, "here")
    fast = canonical_event(body, plain, WHAT, "here")
    assert fast == canonical_event(body, False, WHAT, "here")
    if "big" not in body:
        assert fast == rfc8785.dumps(body)
    assert plain == ("f" not in body and "e" not in body)


def test_big_integers_are_written_exactly_in_the_slow_path() -> None:
    exact = canonical_foreign_json({"n": 2**60, "x": [0.5]}, plain=False)
    assert exact == b'{"n":1152921504606846976,"x":[0.5]}'


def test_unencodable_event_is_refused_naming_where() -> None:
    with pytest.raises(ChangelogError, match="here: cannot canonicalize event"):
        canonical_event({"s": "\ud800"}, True, WHAT, "here")


def test_list_segments_sorted_filtered_and_missing_folder(tmp_path: Path) -> None:
    write(tmp_path, "b.jsonl", [])
    write(tmp_path, "a/x.jsonl.zst", [])
    write(tmp_path, ".hidden.jsonl", [])
    write(tmp_path, "notes.txt", [])
    names = [s.name for s in list_segments(tmp_path, DEFAULT_INCLUDE)]
    assert names == ["a/x.jsonl.zst", "b.jsonl"]
    with pytest.raises(ChangelogError, match="does not exist"):
        list_segments(tmp_path / "nope", DEFAULT_INCLUDE)
