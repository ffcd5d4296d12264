"""An object's canonical records in pieces: each piece a bounded records table the later stages
run a task over, and a snapshot whose objects are cut into pieces decides every record as one
whose objects are not."""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from pydantic import ValidationError

from corpus_assets.core.audit.record_lineage import record_lineage
from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import verify
from corpus_assets.core.records import kept, pieces
from corpus_assets.core.records.index import CanonicalIndex, ChunkDescriptor
from corpus_assets.core.records.pieces import PiecedWriter
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import PARQUET, make_ref, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.demo import write_demo

SCHEMA = pa.schema([("line", pa.int64()), ("text", pa.string())])


def _group(start: int, rows: int) -> pa.Table:
    lines = list(range(start, start + rows))
    return pa.table({"line": lines, "text": [f"row {n}" for n in lines]}, schema=SCHEMA)


def test_a_piece_holds_at_most_its_groups_with_put_tables_bytes(tmp_path: Path) -> None:
    """Nine row groups at four a piece: pieces of 4, 4 and 1 groups, each the bytes
    ``put_table`` gives its rows, the counts theirs; nothing written is one empty piece."""
    cas = ContentStore(tmp_path / "cas")
    writer = PiecedWriter(cas, SCHEMA, groups=4)
    groups = [_group(10 * n, 3 + n % 2) for n in range(9)]
    for group in groups:
        writer.write_table(group)
    made = writer.close()
    assert [p.count for p in made] == [14, 14, 3]
    for piece, held in zip(made, (groups[:4], groups[4:8], groups[8:]), strict=True):
        path = cas.path(piece.records["digest"])
        assert pq.ParquetFile(path).metadata.num_row_groups == len(held)
        assert pq.read_table(path).equals(pa.concat_tables(held))
    assert made[2].records == put_table(cas, groups[8])
    (empty,) = PiecedWriter(cas, SCHEMA, groups=4).close()
    assert empty.count == 0 and pq.read_table(cas.path(empty.records["digest"])).num_rows == 0


def _descriptor(**fields: object) -> dict[str, object]:
    ref = make_ref("sha256:" + "0" * 64, PARQUET, 1)
    account = {"rows_in": 3, "kept": 3, "quarantined": {}, "rejected": {}, "pii_redacted": {}}
    account |= {"normalized": {}, "chars_kept": 9}
    return {"count": 3, "excluded": ref, "account": account} | {
        k: (ref if v == "ref" else v) for k, v in fields.items()
    }


def test_a_descriptor_names_its_records_one_way_by_its_schema() -> None:
    """v2 (one table, as earlier builds stored it) reads as one piece; v3 needs pieces that
    hold its count; a mixed or miscounted descriptor is refused, saying why."""
    old = ChunkDescriptor.model_validate(_descriptor(schema="corpus.chunk.v2", records="ref"))
    assert [p.count for p in old.parts()] == [3]
    piece = {"records": "ref", "count": 3}
    new = _descriptor(schema="corpus.chunk.v3", pieces=[piece])
    new["pieces"] = [{**piece, "records": new["excluded"]}]
    assert [p.count for p in ChunkDescriptor.model_validate(new).parts()] == [3]
    refused = {
        "names one records table": _descriptor(schema="corpus.chunk.v2", pieces=new["pieces"]),
        "in pieces, and only so": _descriptor(schema="corpus.chunk.v3", records="ref"),
        "pieces hold 3 records, its count says 4": {**new, "count": 4},
    }
    for why, document in refused.items():
        with pytest.raises(ValidationError, match=why):
            ChunkDescriptor.model_validate(document)


def _build(home: Path, monkeypatch: pytest.MonkeyPatch, piece_groups: int) -> tuple[Workspace, str]:
    """The demo built, validated and verified in ``home``, its records in row groups of 16
    rows and pieces of ``piece_groups`` groups (in this process: no pool worker starts); the
    workspace and the snapshot id."""
    write_demo(home)
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
    monkeypatch.setattr(kept, "ROW_GROUP_ROWS", 16)
    monkeypatch.setattr(pieces, "PIECE_GROUPS", piece_groups)
    ws = open_workspace()
    sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)  # the canary, the accounts, every rule
    assert report.ok, report.findings
    assert verify(ws.cas, ws.catalog, sid).ok
    return ws, sid


def _rows(
    ws: Workspace, layer: str, output: str, columns: list[str], key: str = "p1"
) -> list[dict[str, object]]:
    """A layer's table of partition ``key`` (stored whole or in parts), by record id."""
    _, index = read_layer_index(ws, key, layer)
    table = PartedTable.read(ws.cas, index.output(output), output)
    paths = table.paths(VerifiedFiles(ws.cas), output)
    rows = pa.concat_tables(pq.read_table(path, columns=columns) for path in paths).to_pylist()
    return sorted(rows, key=lambda row: (str(row["record_id"]), str(row.get("position"))))


def test_objects_in_pieces_decide_every_record_as_whole_objects_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo with its largest object (120 essays) in four pieces of two groups against the
    same demo with one piece an object: the same records, dedup verdicts and matches, splits
    and mixed samples, both validated (the canary replays the pieced object's first lines), and
    a record of the last piece traced to its source line."""
    whole, _ = _build(tmp_path / "whole", monkeypatch, piece_groups=1000)
    cut, sid = _build(tmp_path / "cut", monkeypatch, piece_groups=2)
    sizes = {}
    for name, ws in (("whole", whole), ("cut", cut)):
        _, canonical = CanonicalIndex.read(ws, "p1")
        sizes[name] = [c.count for c in canonical.chunks() if "essays-00000" in c.key]
    assert sizes == {"whole": [120], "cut": [32, 32, 32, 24]}
    dedup = ["record_id", "verdict", "representative_id", "match_id", "leakage_id", "excluded"]
    assert _rows(cut, "dedup_clusters", "clusters", dedup) == _rows(
        whole, "dedup_clusters", "clusters", dedup
    )
    views = {("splits", "splits"): ["record_id", "leakage_id", "split"]}
    views[("mixed_samples", "samples")] = ["record_id", "position", "repeat", "weight"]
    for (layer, output), columns in views.items():
        assert _rows(cut, layer, output, columns) == _rows(whole, layer, output, columns)
    snapshot = states.get(cut.catalog, sid)  # a record of the last piece, traced to its line:
    lineage = record_lineage(cut.cas, cut.catalog, snapshot, "essays/e0119", cut.config)
    assert lineage["origin"]["line"] == 120 and lineage["status"] == "member", lineage
    whole.close()
    cut.close()


def _later_essays(home: Path) -> None:
    """A new object: three new essays and edited copies (new ids) of two essays of the big
    object's last piece."""
    essays = home / "demo-sources" / "essays"
    old = zstandard.ZstdDecompressor().decompress(
        (essays / "essays-00000.jsonl.zst").read_bytes(), max_output_size=1 << 24
    )
    rows = {r["id"]: r for r in map(json.loads, old.decode().splitlines()[:120])}
    later = [{"id": f"new{n}", "text": f"A new essay number {n} about lanterns."} for n in range(3)]
    later += [{"id": f"{i}-again", "text": rows[i]["text"] + " again"} for i in ("e0100", "e0110")]
    (essays / "later.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))


DECIDED = {
    ("dedup_clusters", "clusters"): ["record_id", "verdict", "match_id", "leakage_id", "excluded"],
    ("splits", "splits"): ["record_id", "split"],
    ("mixed_samples", "samples"): ["record_id", "repeat"],
}


def test_a_child_over_objects_in_pieces_decides_as_a_fresh_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent whose largest object is four pieces, approved and active; a child adding an
    object (new essays, edited copies of the last piece's) keeps its parent's work (dedup
    incremental over the parent's parts) and decides every record as a fresh build of the
    same sources does."""
    chain, sid = _build(tmp_path / "chain", monkeypatch, piece_groups=2)
    approve(chain, sid, by="reviewer")
    activate(chain, sid, actor="test")
    _later_essays(tmp_path / "chain")
    child = build_all(chain, "p2")
    assert validate_snapshot(chain, child["manifest"].digests["snapshotId"]).ok
    stats = child["dedup_clusters"].run_stats
    assert stats["near_incremental"] == 1 and stats["pairs_reused"] > 0, stats
    write_demo(tmp_path / "fresh")
    _later_essays(tmp_path / "fresh")
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / "fresh"))
    monkeypatch.setenv("CORPUS_CONFIG", str(tmp_path / "fresh" / "corpus.yaml"))
    with open_workspace() as fresh:
        build_all(fresh, "p2")
        for (layer, output), columns in DECIDED.items():
            assert _rows(chain, layer, output, columns, "p2") == _rows(
                fresh, layer, output, columns, "p2"
            ), layer
    chain.close()


LARGE_FILE_PIECES = [262_144, 37_856]  # the records of each piece of ``one_large_file``


def one_large_file(home: Path, execution: str) -> None:
    """A source of one file of 300,000 short documents (random words: no near pairs), more
    than four row groups of 65,536 records (``LARGE_FILE_PIECES``), built with ``execution``."""
    rng = random.Random(7)
    words = [f"w{n}" for n in range(5000)]
    folder = home / "big"
    folder.mkdir(parents=True)
    with (folder / "all.jsonl").open("w") as out:
        for n in range(300_000):
            text = " ".join(rng.choice(words) for _ in range(8))
            out.write(json.dumps({"id": f"d{n}", "text": text}) + "\n")
    (home / "corpus.yaml").write_text(
        "version: 1\npurpose: pieces\nsources:\n  - {id: big, kind: objects, path: big}\n"
        f"execution: {execution}\n"
    )


def test_one_large_file_is_cut_alike_in_the_pool_and_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file of 300,000 documents: two pieces (262,144 and 37,856 records), whose tasks
    (signatures, tokens, members, shards) run here with one worker and in spawned pool workers
    with two; the same layers byte for byte and the same snapshot id, both validated. (The
    file's canonical task runs here either way: one job never leaves the process.)"""
    built = {}
    for workers in (1, 2):
        home = tmp_path / f"w{workers}"
        # in_process_bytes 0: with two workers, the pool for every map of more than one job
        one_large_file(home, f"{{workers: {workers}, in_process_bytes: 0}}")
        monkeypatch.setenv("CORPUS_HOME", str(home))
        monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
        with open_workspace() as ws:
            results = build_all(ws, "p1")
            _, canonical = CanonicalIndex.read(ws, "p1")
            assert [c.count for c in canonical.chunks()] == LARGE_FILE_PIECES
            sid = results["manifest"].digests["snapshotId"]
            assert validate_snapshot(ws, sid).ok
            built[workers] = {layer: result.digest for layer, result in results.items()}
            built[workers]["manifest"] = sid  # the manifest also names the home's paths
    assert built[1] == built[2]
