"""The mixing layer finds its train members' rows through the dedup decisions table (integer
positions, digests parsed once per chunk) and gives the bytes of the join on (record id, object,
line), which still runs without a decisions table. Real builds: the demo, and a source whose
second object repeats two record ids of the first (an exact repeat and an id conflict), every
record in train, so a repeated id's excluded row must not become a second candidate."""

import json
from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.tokens.cache import token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.mixing import build
from corpus_assets.core.training_view.mixing.build import build_mixed_samples

WORDS = "river mountain window garden lantern harbor meadow orbit pebble quartz velvet ember"


def _text(n: int) -> str:
    words = WORDS.split()
    return " ".join(f"{words[(n * 7 + k * 5) % len(words)]}{n}x{k}" for k in range(12)) + "."


def _train_only(root: Path) -> Path:
    """A config over ``root/src`` (one source) with every record in train."""
    config = root / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: mixing-test\nstorage: {{home: {root / 'home'}}}\n"
        "sources:\n  - {id: docs, kind: objects, path: src}\n"
        "policies:\n  splits: {train_percent: 100, validation_percent: 0, test_percent: 0}\n"
    )
    return config


def _repeated_ids(root: Path) -> Path:
    source = root / "src"
    source.mkdir()
    rows = [{"id": f"a{n}", "text": _text(n)} for n in range(10)]
    (source / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = [{"id": "a7", "text": _text(7) + " " + _text(99)}, {"id": "a3", "text": _text(3)}]
    (source / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in again))
    return _train_only(root)


def corpus_workspace(corpus: str, request: pytest.FixtureRequest, tmp_path: Path) -> Workspace:
    """The demo's workspace (``demo_home``) or one over ``_repeated_ids``, by name."""
    if corpus == "demo":
        request.getfixturevalue("demo_home")
        return open_workspace()
    return open_workspace(_repeated_ids(tmp_path))


@pytest.mark.parametrize("corpus", ["demo", "repeated_ids"])
def test_members_by_position_give_the_bytes_of_the_join_on_keys(
    corpus: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = corpus_workspace(corpus, request, tmp_path)
    built = build_all(ws, "p1")
    keyed: list[int] = []
    by_keys = build._members_by_keys

    def counted(*args: object) -> None:
        keyed.append(1)
        by_keys(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "_members_by_keys", counted)
    again = build_mixed_samples(ws, "p1")
    assert keyed == []  # matched on positions: the dedup layer has its decisions table
    assert again.digests == built["mixed_samples"].digests
    if corpus == "repeated_ids":
        assert again.counts["samples"] == 10  # a3 and a7 once each
    monkeypatch.setattr(build, "row_order", lambda *_: None)  # no decisions table
    fallback = build_mixed_samples(ws, "p1")
    assert keyed == [1]
    assert fallback.digests == built["mixed_samples"].digests
    ws.close()


def _interleaved(root: Path) -> Path:
    """Two objects whose record ids interleave (m0, m2, ... and m1, m3, ...): the clusters
    table's positions (chunk by chunk) are not record id order."""
    source = root / "src"
    source.mkdir()
    for name, first in (("a", 0), ("b", 1)):
        rows = [{"id": f"m{n}", "text": _text(n)} for n in range(first, 10, 2)]
        (source / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return _train_only(root)


def _members(ws: Workspace, monkeypatch: pytest.MonkeyPatch, by_keys: bool) -> build.Members:
    """The source's members as the layer reads them, by positions or (``by_keys``) on keys."""
    if by_keys:
        monkeypatch.setattr(build, "row_order", lambda *_: None)
    _, splits = read_layer_index(ws, "p1", "splits")
    _, canonical = CanonicalIndex.read(ws, "p1")
    _, dedup = read_layer_index(ws, "p1", "dedup_clusters")
    tokens = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    with view_queries.spilling(ws.home, 1) as con:
        values = build.train_members(ws, con, splits, dedup, canonical, tokens)
        assert (values is None) == by_keys
        if values is not None:  # the premise: positions do not follow the record ids
            rows = con.sql("SELECT record_id, pos FROM train_members ORDER BY pos").fetchall()
            assert [r[0] for r in rows] != sorted(r[0] for r in rows)
        return build.source_members(con, ["docs"], ws.home / "tmp", values)["docs"]


def test_members_come_in_record_id_order_whatever_their_positions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by position, the members come in record id order as the keyed join's do:
    ids, digest bits and token counts alike (positions are chunk by chunk, so an order by
    position would not be record id order here)."""
    ws = open_workspace(_interleaved(tmp_path))
    try:
        build_all(ws, "p1")
        by_position = _members(ws, monkeypatch, by_keys=False)
        by_keys = _members(ws, monkeypatch, by_keys=True)
    finally:
        ws.close()
    ids = by_position.record_id.to_pylist()
    assert ids == sorted(ids) and len(ids) == 10
    assert ids == by_keys.record_id.to_pylist()
    assert by_position.digest_bits().tolist() == by_keys.digest_bits().tolist()
    assert by_position.tokens.tolist() == by_keys.tokens.tolist()
