"""The small real corpus every case builds: deterministic objects of prose-like rows with a
few exact duplicates, enough rows for chunking, dedup, splits and packing to do real work."""

import json
import random
from pathlib import Path
from typing import Any

import zstandard

_PHRASE = (
    "river stone paper light signal harbour copper winter garden engine orbit lantern market "
    "thread window meadow silver question answer method record source layer build verify"
)
WORDS = tuple(_PHRASE.split(" "))


def row_text(rng: random.Random, words: int = 60) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def write_zstd_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as a zstd JSONL object (what other tools drop into a source folder)."""
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    return path


def write_objects(folder: Path, objects: int = 6, lines: int = 250, seed: int = 7) -> list[Path]:
    """``objects`` zstd JSONL files of ``lines`` rows each; every 50th row repeats an earlier
    text (an exact duplicate for dedup to remove)."""
    rng = random.Random(seed)
    paths = []
    for n in range(objects):
        rows = [
            {
                "id": f"{n}-{i}",
                "text": row_text(rng) if i % 50 else f"repeated {n % 2} " + "shared text " * 20,
            }
            for i in range(lines)
        ]
        paths.append(write_zstd_jsonl(folder / f"part-{n:03d}.jsonl.zst", rows))
    return paths
