"""Tokenisation through the per-chunk token cache, against named baselines in the same run.

Texts: every shard of the shared corpora (``--corpora``; synthetic English-like text when they
are absent), cut into chunks of at most 20,000 documents / 16 MB, each stored in a real CAS as a
records table (``record_id``, ``text``; zstd Parquet, as canonical chunks are) with a real
SQLite catalog. "Ours" is ``tokens.cache.ensure_tokens`` with one worker - read the Parquet
text column a batch at a time, encode, write the ``ids``/``offsets`` ``.npy`` files into the CAS
(hashed, fsynced, hard-linked), record the chunk task - run in a fresh child process whose
``VmHWM`` is its peak RSS (floor: its RSS after imports and opening the workspace); before each
run the token tasks and their CAS objects are deleted, so every run tokenises everything.

(a) ``utf8-bytes-v1``: MB of UTF-8 text per second of wall time and per CPU-second (the child's
user + system time), against the baseline ``text.encode("utf-8")`` over the same in-memory
``str`` list (and, for context, our encoder alone on in-memory Arrow slices of 4 MB, as the
cache calls it). Target: >= 200 MB/s per core. (b) Hugging Face: a byte-level BPE trained by our
trainer (``tokens.bpe``) on the first ``--train-mb`` MB of the texts; ours against
``Tokenizer.encode_batch(texts, add_special_tokens=False)`` called directly on the same
in-memory texts (on the first ``--hf-mb`` MB), a whole chunk per call and 1,024 texts per call;
the ratio is against the faster. Ours calls ``encode_batch_fast`` (same ids, no character
offsets), so that is printed too, with the ratio against it. Target: ours / direct <= 1.2.
Before timing, ours is checked token for token against the baselines on the first chunk (exit 1
on a mismatch). Medians of ``--repeats``.

Usage: .venv/bin/python bench/tokenize_bench.py [--corpora ../shared/corpora] [--repeats 5]
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from sqlalchemy import delete

from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, put_table
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.core.tokens.cache import LAYER, SLICE_BYTES, ensure_tokens, open_tokens
from corpus_assets.core.tokens.encode import byte_slices, encode_batch
from corpus_assets.core.tokens.spec import load_hf, resolve_tokenizer, utf8_spec

CHUNK_DOCS, CHUNK_BYTES = 20_000, 16 << 20
SPECIALS = ("<|endoftext|>", "<|pad|>")
UTF8_TARGET, HF_TARGET = 200.0, 1.2


def load_texts(corpora: Path) -> tuple[list[list[str]], str]:
    """Chunks of texts: each shard cut at CHUNK_DOCS / CHUNK_BYTES (synthetic if no corpora)."""
    shards = sorted(corpora.glob("*/*.jsonl.zst"))
    if not shards:
        rng = random.Random(0)
        words = [
            "the",
            "of",
            "and",
            "data",
            "file",
            "value",
            "return",
            "error",
            "function",
            "module",
            "license",
            "python",
        ]
        texts = [" ".join(rng.choices(words, k=rng.randint(20, 400))) for _ in range(100_000)]
        return [texts[n : n + CHUNK_DOCS] for n in range(0, len(texts), CHUNK_DOCS)], "synthetic"
    import zstandard

    chunks: list[list[str]] = []
    for shard in shards:
        current: list[str] = []
        size = 0
        with zstandard.open(shard, "rt", encoding="utf-8") as fh:
            for line in fh:
                text = json.loads(line)["text"]
                current.append(text)
                size += len(text.encode())
                if len(current) >= CHUNK_DOCS or size >= CHUNK_BYTES:
                    chunks.append(current)
                    current, size = [], 0
        if current:
            chunks.append(current)
    return chunks, f"{len(shards)} shards of {corpora}"


def _status_kb() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(config: str, chunks_file: str) -> None:
    """One timed ensure_tokens run over every chunk; prints a JSON line."""
    with open_workspace(config) as ws:
        spec = resolve_tokenizer(ws)  # a Hugging Face file is parsed here, before the clock
        if spec.kind != "utf8-bytes-v1":
            load_hf(ws.cas, spec.digest)
        chunks = [ChunkRecords(**c) for c in json.loads(Path(chunks_file).read_text())]
        floor = _status_kb()["VmRSS"]
        cpu, start = _cpu_seconds(), time.perf_counter()
        cached = ensure_tokens(ws, chunks, spec, workers=1)
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        assert all(c.tokenized for c in cached)
        peak = _status_kb()["VmHWM"]
    print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_kb": peak, "floor_kb": floor}))


def run_ours(ws: Workspace, config: Path, chunks_file: Path) -> dict:
    """Forget every token task and its outputs, then time a fresh child."""
    for digest in _token_outputs(ws):
        ws.cas.path(digest).unlink(missing_ok=True)
    with ws.catalog.begin() as conn:
        conn.execute(delete(chunk_tasks).where(chunk_tasks.c.layer == LAYER))
    cmd = [sys.executable, __file__, "--child", str(config), "--chunks", str(chunks_file)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _token_outputs(ws: Workspace) -> list[str]:
    with ws.catalog.begin() as conn:
        rows = conn.execute(chunk_tasks.select().where(chunk_tasks.c.layer == LAYER)).mappings()
        descriptors = [r["output_digest"] for r in rows if r["output_digest"]]
    out = []
    for digest in descriptors:
        if ws.cas.contains(digest):
            document = get_json(ws.cas, digest)
            out += [digest, document["ids"]["digest"], document["offsets"]["digest"]]
    return out


def setup(root: Path, chunks: list[list[str]], tokenizer: dict | None) -> tuple[Path, Path]:
    """A data home whose CAS holds each chunk as a records table; its config and chunk list."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "corpus.yaml"
    policies = {"tokenizer": tokenizer} if tokenizer else {}
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "purpose": "bench",
                "storage": {"home": str(root / "home")},
                "sources": [{"id": "bench", "kind": "objects", "path": str(root)}],
                "policies": policies,
            }
        )
    )
    listed = []
    with open_workspace(config) as ws:
        for n, texts in enumerate(chunks):
            ids = [f"bench/{n}-{i}" for i in range(len(texts))]
            ref = put_table(ws.cas, pa.table({"record_id": ids, "text": texts}))
            listed.append({"key": f"chunk-{n:04d}", "records": ref, "count": len(texts)})
    chunks_file = root / "chunks.json"
    chunks_file.write_text(json.dumps(listed))
    return config, chunks_file


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_first_chunk(config: Path, chunks_file: Path, expected: list[list[int]]) -> None:
    """Ours, from the CAS, equals the baseline's tokens for every record of the first chunk."""
    with open_workspace(config) as ws:
        spec = resolve_tokenizer(ws)
        first = ChunkRecords(**json.loads(chunks_file.read_text())[0])
        arrays = open_tokens(ws, ensure_tokens(ws, [first], spec, 1)[0], spec)
        same = all(arrays.record(n).tolist() == e for n, e in enumerate(expected))
    print(f"  check: ours == baseline on {len(expected):,d} records of the first chunk: {same}")
    if not same:
        sys.exit(1)


def bench_utf8(root: Path, chunks: list[list[str]], repeats: int) -> None:
    megabytes = sum(len(t.encode()) for c in chunks for t in c) / 1e6
    docs = sum(map(len, chunks))
    print(f"(a) utf8-bytes-v1: {docs:,d} docs, {megabytes:.1f} MB in {len(chunks)} chunks")
    config, chunks_file = setup(root / "utf8", chunks, None)
    check_first_chunk(config, chunks_file, [[*t.encode(), 256] for t in chunks[0]])
    encode = median_time(lambda: [t.encode("utf-8") for c in chunks for t in c], repeats)
    arrays = [s for c in chunks for s in byte_slices(pa.array(c, pa.string()), SLICE_BYTES)]
    spec = utf8_spec()
    ours_memory = median_time(lambda: [encode_batch(spec, a) for a in arrays], repeats)
    with open_workspace(config) as ws:
        runs = [run_ours(ws, config, chunks_file) for _ in range(repeats)]
    wall = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu"] for r in runs)
    peak = statistics.median(r["peak_kb"] for r in runs) / 1024
    floor = statistics.median(r["floor_kb"] for r in runs) / 1024
    print(f"  baseline text.encode('utf-8') loop (in memory): {megabytes / encode:8.0f} MB/s")
    print(f"  ours encode_batch alone (in memory, 4 MB calls): {megabytes / ours_memory:7.0f} MB/s")
    print(f"  ours ensure_tokens (CAS in and out, 1 worker):  {megabytes / wall:8.0f} MB/s wall,")
    print(f"      {megabytes / cpu:.0f} MB per CPU-second ({wall:.2f} s wall, {cpu:.2f} s CPU)")
    print(f"  ratio ours (wall) / baseline: {encode / wall:.2f}x the baseline's throughput")
    print(f"  ours peak RSS {peak:.0f} MB (floor after imports {floor:.0f} MB)")
    verdict = "PASS" if megabytes / cpu >= UTF8_TARGET else "FAIL"
    print(f"  {megabytes / cpu:.0f} MB per CPU-second vs target {UTF8_TARGET:.0f}: {verdict}")


def bench_hf(root: Path, chunks: list[list[str]], args: argparse.Namespace) -> None:
    hf_chunks = _first_mb(chunks, args.hf_mb)
    train = _first_mb(chunks, args.train_mb)
    start = time.perf_counter()
    data = train_byte_level_bpe(train, args.vocab_size, list(SPECIALS))
    print(
        f"(b) Hugging Face: BPE {args.vocab_size} trained on {args.train_mb} MB by tokens.bpe "
        f"in {time.perf_counter() - start:.1f} s"
    )
    (root / "hf").mkdir(parents=True)
    (root / "hf" / "bpe.json").write_bytes(data)
    section = {"kind": "huggingface", "path": "bpe.json", "eos": SPECIALS[0], "pad": SPECIALS[1]}
    config, chunks_file = setup(root / "hf", hf_chunks, section)
    megabytes = sum(len(t.encode()) for c in hf_chunks for t in c) / 1e6
    docs = sum(map(len, hf_chunks))
    print(f"  {docs:,d} docs, {megabytes:.1f} MB in {len(hf_chunks)} chunks")
    with open_workspace(config) as ws:
        tokenizer = load_hf(ws.cas, resolve_tokenizer(ws).digest)
        eos = resolve_tokenizer(ws).eos.id
        direct = tokenizer.encode_batch(hf_chunks[0], add_special_tokens=False)
        check_first_chunk(config, chunks_file, [[*e.ids, eos] for e in direct])

        def baseline(batch: int, fast: bool = False) -> None:
            encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
            for texts in hf_chunks:
                for n in range(0, len(texts), batch):
                    encode(texts[n : n + batch], add_special_tokens=False)

        whole = median_time(lambda: baseline(CHUNK_DOCS), args.repeats)
        batched = median_time(lambda: baseline(1024), args.repeats)
        fast = median_time(lambda: baseline(CHUNK_DOCS, fast=True), args.repeats)
        runs = [run_ours(ws, config, chunks_file) for _ in range(args.repeats)]
    wall = statistics.median(r["seconds"] for r in runs)
    peak = statistics.median(r["peak_kb"] for r in runs) / 1024
    direct_time = min(whole, batched)
    ratio = wall / direct_time
    print(f"  baseline encode_batch, a chunk per call:       {megabytes / whole:6.2f} MB/s")
    print(f"  baseline encode_batch, 1,024 per call:         {megabytes / batched:6.2f} MB/s")
    print(f"  (encode_batch_fast, a chunk per call:          {megabytes / fast:6.2f} MB/s)")
    print(f"  ours ensure_tokens (encode_batch_fast inside): {megabytes / wall:6.2f} MB/s")
    print(f"  ours peak RSS {peak:.0f} MB")
    verdict = "PASS" if ratio <= HF_TARGET else "FAIL"
    print(f"  ours / faster encode_batch time: {ratio:.3f} vs target <= {HF_TARGET}: {verdict}")
    print(f"  ours / encode_batch_fast time: {wall / fast:.3f}")


def _first_mb(chunks: list[list[str]], limit_mb: float) -> list[list[str]]:
    """Whole chunks, round-robin over the list, until ``limit_mb`` MB of text."""
    out, size = [], 0
    for texts in chunks[::2] + chunks[1::2]:
        if size >= limit_mb * 1e6:
            break
        out.append(texts)
        size += sum(len(t.encode()) for t in texts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", type=Path, default=Path("../shared/corpora"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hf-mb", type=float, default=30.0)
    parser.add_argument("--train-mb", type=float, default=10.0)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--child", default=None)
    parser.add_argument("--chunks", default=None)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.chunks)
        return
    chunks, origin = load_texts(args.corpora)
    print(f"texts: {origin}; {os.cpu_count()} CPUs; medians of {args.repeats}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        bench_utf8(Path(tmp), chunks, args.repeats)
        bench_hf(Path(tmp), chunks, args)
    print(
        f"bench process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        " (holds every text in memory for the baselines)"
    )


if __name__ == "__main__":
    main()
