"""Scale the shared corpora to a target size without making the copies duplicates of each other.

Copy ``k`` of every shared document has its ASCII letters rotated by ``k`` places and its CJK
ideographs shifted by ``7k`` code points (a per-copy substitution cipher): within one copy the
corpus keeps its real exact and near duplicates, its scripts and its document lengths, while two
copies share no shingles, so dedup work and survivors grow with the size as they would for more
real text. Copy 0 is the shared corpora unchanged. Written as zstd JSONL objects per source,
each source in its own folder, and streamed: memory stays bounded whatever the size.

Usage: .venv/bin/python bench/race_corpus.py --corpora ../shared/corpora --mb 1100 --out DIR
"""

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import zstandard

SOURCES = {  # shared folder -> (source id, content kind)
    "licenses": ("licenses", "prose"),
    "python-stdlib": ("stdlib", "code"),
    "fortunes": ("fortunes", "prose"),
    "chat-dialogs": ("chat", "prose"),
    "python-docs": ("pydocs", "prose"),
}
LOWER = "abcdefghijklmnopqrstuvwxyz"
UPPER = LOWER.upper()


# The object per source a +1% step adds (race, child_ab, ...): by default named as a source's
# next numbered part, so it sorts after the objects already there, as an append of numbered or
# dated parts does. ``PREPENDED`` (the race's only name until 2026-12-07) sorts before them: the
# new chunk is then each source's first, so the canary replays it and every parent row moves.
APPENDED = "part-99999.jsonl.zst"
PREPENDED = "delta-00000.jsonl.zst"
DELTAS = (APPENDED, PREPENDED)


def cipher(k: int) -> dict[int, int]:
    """The translation table of copy ``k`` (identity for k = 0)."""
    shift = k % 26
    table = {ord(c): ord(LOWER[(i + shift) % 26]) for i, c in enumerate(LOWER)}
    table.update({ord(c): ord(UPPER[(i + shift) % 26]) for i, c in enumerate(UPPER)})
    if k:
        table.update({cp: 0x4E00 + (cp - 0x4E00 + 7 * k) % 0x5200 for cp in range(0x4E00, 0x9FFF)})
    return table


def shared_lines(folder: Path) -> Iterator[bytes]:
    for path in sorted(folder.glob("*.jsonl.zst")):
        with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as reader:
            yield from io.BufferedReader(reader, 1 << 20)


def copy_line(line: bytes, k: int, table: dict[int, int]) -> str:
    doc = json.loads(line)
    if k:
        doc["id"] = f"{doc['id']}~{k}"
        doc["text"] = doc["text"].translate(table)
    return json.dumps(doc, ensure_ascii=False) + "\n"


def write_delta(
    corpora: Path, src: Path, copy: int, budget: int, name: str = APPENDED, part: int = 0
) -> int:
    """``budget`` bytes of copy ``copy`` spread over the sources, each as its object ``name``
    (one of ``DELTAS``, replacing any of them written before); the bytes written. ``part``:
    which ``budget``-sized slice of the copy (each source's lines after the first ``part``
    slices' worth), so one copy gives several deltas of new text (``delta_parts``)."""
    added, share = 0, budget // len(SOURCES)
    for shared, (source_id, _content) in SOURCES.items():
        if not (corpora / shared).is_dir():
            continue
        for other in DELTAS:
            (src / source_id / other).unlink(missing_ok=True)
        out = src / source_id / name
        with zstandard.ZstdCompressor().stream_writer(out.open("wb")) as sink:
            skipped, written, table = 0, 0, cipher(copy)
            for line in shared_lines(corpora / shared):
                if written >= share:
                    break
                data = copy_line(line, copy, table).encode()
                if skipped < part * share:  # counted as written: slices never overlap
                    skipped += len(data)
                    continue
                sink.write(data)
                written += len(data)
        added += written
    return added


def delta_parts(corpora: Path, budget: int) -> int:
    """How many whole ``write_delta`` slices of ``budget`` bytes every copy holds (the smallest
    source's count: a copy's text is new in each), as copy 25 writes them (the longest ids)."""
    share, table = budget // len(SOURCES), cipher(25)
    sizes = [
        sum(len(copy_line(line, 25, table).encode()) for line in shared_lines(corpora / name))
        for name in SOURCES
        if (corpora / name).is_dir()
    ]
    return min(sizes) // share if share else 0


def shared_bytes(corpora: Path) -> int:
    return sum(
        len(line)
        for name in SOURCES
        if (corpora / name).is_dir()
        for line in shared_lines(corpora / name)
    )


def write_corpus(corpora: Path, out: Path, target_mb: float, object_mb: int = 64) -> dict:
    """Write copies 0..n-1 until about ``target_mb`` MB of JSONL; returns the source list."""
    copies = max(1, round(target_mb * 1e6 / shared_bytes(corpora)))
    written, sources = 0, []
    for name, (source_id, content) in SOURCES.items():
        if not (corpora / name).is_dir():
            continue
        folder = out / source_id
        folder.mkdir(parents=True, exist_ok=True)
        written += _write_source(corpora / name, folder, copies, object_mb)
        sources.append({"id": source_id, "path": str(folder), "content": content})
    return {"copies": copies, "jsonl_bytes": written, "sources": sources}


def _write_source(shared: Path, folder: Path, copies: int, object_mb: int) -> int:
    total, part, size, sink = 0, 0, 0, None
    compressor = zstandard.ZstdCompressor(level=3)
    for k in range(copies):
        table = cipher(k)
        for line in shared_lines(shared):
            if sink is None:
                sink = compressor.stream_writer((folder / f"part-{part:05d}.jsonl.zst").open("wb"))
            data = copy_line(line, k, table).encode()
            sink.write(data)
            total, size = total + len(data), size + len(data)
            if size >= object_mb << 20:
                sink.close()
                sink, size, part = None, 0, part + 1
    if sink is not None:
        sink.close()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=Path("../shared/corpora"))
    parser.add_argument("--mb", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(json.dumps(write_corpus(args.corpora, args.out, args.mb), indent=1))


if __name__ == "__main__":
    main()
