"""The benchmark registry as a user drives it: ``corpus-assets benchmark add|list|remove``.

Registration is idempotent (the same id and text twice is one item, the fence stays), refuses an
id with another text naming the file and line (writing nothing), reads plain, gzip and zstd
JSONL; removal is a row in the same seq space that advances every fence, and the items active at
a fence are what a build at that fence reads. On SQLite and PostgreSQL, in process.
"""

import gzip
import json
from pathlib import Path

import pytest
import zstandard
from sqlalchemy import func, select

from corpus_assets.cli.main import main
from corpus_assets.cli.parser import with_add
from corpus_assets.core.governance import alias_gate, benchmarks
from corpus_assets.core.storage.catalog import Catalog, benchmark_items

QUIZ = [
    {"id": "q1", "text": "What is the capital of France?"},
    {"id": "q2", "text": "How many legs has a spider?"},
    {"id": "q3", "text": "Who wrote Hamlet?"},
]


@pytest.fixture
def home(tmp_path: Path, catalog_url: str, monkeypatch: pytest.MonkeyPatch) -> Catalog:
    """A data home without a config; the catalog on each backend, an alias gate row in it."""
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / "corpus"))
    monkeypatch.setenv("CORPUS_CATALOG_URL", catalog_url)
    monkeypatch.delenv("CORPUS_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    catalog = Catalog(catalog_url)
    alias_gate.read_alias_gate(catalog, "demo")  # an alias exists: every change must fence it
    return catalog


def _cli(capsys: pytest.CaptureFixture[str], *args: str, ok: bool = True) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert (code == 0) == ok, (args, out, err)
    return out if ok else err


def _jsonl(path: Path, rows: list[dict]) -> Path:
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _rows(catalog: Catalog) -> int:
    with catalog.begin() as conn:
        return conn.scalar(select(func.count()).select_from(benchmark_items))


def _fence(catalog: Catalog) -> int:
    return alias_gate.read_alias_gate(catalog, "demo").benchmark_fence


def test_registering_twice_is_one_item_and_another_text_is_refused(
    home: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _jsonl(tmp_path / "quiz.jsonl", QUIZ[:2])
    assert _cli(capsys, "benchmark", "quiz", str(plain)) == (
        "benchmark quiz: 2 items; benchmark fence now 2\n"
    )
    assert (_rows(home), _fence(home)) == (2, 2)
    again = _cli(capsys, "benchmark", "add", "quiz", str(plain))
    assert again == "benchmark quiz: 0 items (2 already registered); benchmark fence now 2\n"
    assert (_rows(home), _fence(home)) == (2, 2)  # no row, no fence advance

    for name in ("quiz.jsonl.gz", "quiz.jsonl.zst"):  # the same items, compressed: one each
        packed = _jsonl(tmp_path / name, QUIZ)
        added = _cli(capsys, "benchmark", "quiz", str(packed))
        expected = 1 if name.endswith(".gz") else 0
        assert added.startswith(f"benchmark quiz: {expected} items (")
    assert (_rows(home), _fence(home)) == (3, 3)

    changed = [QUIZ[2], {"id": "new", "text": "A new question?"}, {**QUIZ[0], "text": "Other?"}]
    conflicting = str(_jsonl(tmp_path / "c.jsonl", changed))
    refused = _cli(capsys, "benchmark", "quiz", conflicting, ok=False)
    assert "'quiz/q1'" in refused and f"{tmp_path / 'c.jsonl'} line 3" in refused
    assert len(refused.strip().splitlines()) == 1
    assert (_rows(home), _fence(home)) == (3, 3)  # the whole registration wrote nothing


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"id": "a", "text": "ok"}\n{"id": "b", "text": \n', "line 2: not JSON"),
        (b'{"id": "a", "text": "ok"}\n\n{"id": "b"}\n', "line 3: field 'text' is missing"),
        (b'{"id": "a", "text": 7}\n', "line 1: field 'text' is int"),
        (b'["a"]\n', "line 1: a JSON object per line is expected"),
        (b'{"id": true, "text": "x"}\n', "line 1: 'id' must be"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(
    home: Catalog,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    expected: str,
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    error = _cli(capsys, "benchmark", "quiz", str(path), ok=False)
    assert error == f"corpus-assets: error: {path} {expected}" + error.split(expected, 1)[1]
    assert len(error.strip().splitlines()) == 1 and _rows(home) == 0


def test_a_truncated_compressed_file_is_refused(
    home: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = _jsonl(tmp_path / "quiz.jsonl.zst", QUIZ).read_bytes()
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(whole[:-5])
    error = _cli(capsys, "benchmark", "quiz", str(cut), ok=False)
    assert str(cut) in error and "trunc" in error.lower()
    assert _rows(home) == 0


def test_remove_fences_every_alias_and_changes_what_is_active(
    home: Catalog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli(capsys, "benchmark", "quiz", str(_jsonl(tmp_path / "quiz.jsonl", QUIZ)))
    _cli(capsys, "benchmark", "other", str(_jsonl(tmp_path / "o.jsonl", QUIZ[:1])))
    removed = _cli(capsys, "benchmark", "remove", "quiz", "--item", "q2")
    assert removed == (
        "benchmark quiz: 1 items removed; every alias is fenced at benchmark fence 5\n"
    )
    assert _fence(home) == 5
    with home.begin() as conn:
        before = [r.item_id for r in benchmarks.active_items(conn, 4)]
        after = [r.item_id for r in benchmarks.active_items(conn, 5)]
        removal = conn.execute(select(benchmark_items).where(benchmark_items.c.seq == 5)).one()
    assert before == ["quiz/q1", "quiz/q2", "quiz/q3", "other/q1"]
    assert after == ["quiz/q1", "quiz/q3", "other/q1"]
    assert (removal.action, removal.item_id, removal.actor[:4]) == ("remove", "quiz/q2", "cli:")

    payload = json.loads(_cli(capsys, "benchmark", "list"))
    listed = {b["benchmark"]: b for b in payload["benchmarks"]}
    quiz = listed["quiz"]
    assert (quiz["items"], quiz["firstSeq"], quiz["lastSeq"]) == (2, 1, 3)
    assert (listed["quiz"]["removals"], listed["other"]["items"]) == (1, 1)
    assert listed["quiz"]["registeredAt"].endswith("Z")

    missing = _cli(capsys, "benchmark", "remove", "quiz", "--item", "q2", ok=False)
    assert "no active item(s) 'quiz/q2'" in missing and _fence(home) == 5
    _cli(capsys, "benchmark", "remove", "quiz")  # the rest of it
    readded = _cli(capsys, "benchmark", "quiz", str(tmp_path / "quiz.jsonl"))
    assert readded == "benchmark quiz: 3 items; benchmark fence now 10\n"  # removed: new rows
    with home.begin() as conn:
        assert [r.seq for r in benchmarks.active_items(conn, 7)] == [4]
        assert len(benchmarks.active_items(conn, None, benchmark="quiz")) == 3


def test_the_form_before_subcommands_still_means_add() -> None:
    assert with_add(["benchmark", "quiz", "f.jsonl"]) == ["benchmark", "add", "quiz", "f.jsonl"]
    assert with_add(["--config", "c.yaml", "benchmark", "q", "f"])[2:4] == ["benchmark", "add"]
    assert with_add(["--config=c.yaml", "benchmark", "q", "f"])[1:3] == ["benchmark", "add"]
    for unchanged in (["benchmark", "list"], ["benchmark", "remove", "q"], ["benchmark", "-h"]):
        assert with_add(unchanged) == unchanged
    assert with_add(["show", "benchmark"]) == ["show", "benchmark"]
    legacy = ["benchmark", "--text-field", "body", "q", "f"]  # an option first, as it could be
    assert with_add(legacy) == ["benchmark", "add", *legacy[1:]]


def test_registering_many_items_is_batched(home: Catalog) -> None:
    """2,500 items: more than one executemany batch, every seq once, fence at the last."""
    items = [
        benchmarks.BenchmarkItem(f"big/{n:05}", f"sha256:{n:064}", f"sha256:{n:064}")
        for n in range(2500)
    ]
    change = benchmarks.register(home, "big", items)
    assert (change.seq, change.written, _fence(home)) == (2500, 2500, 2500)
    assert benchmarks.register(home, "big", items) == benchmarks.Change(2500, 0, 2500)
    with home.begin() as conn:
        active = benchmarks.active_items(conn, 2500)
    assert [r.item_id for r in active] == [i.item_id for i in items]
