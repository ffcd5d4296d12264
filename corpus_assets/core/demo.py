"""A small, deterministic demo source set and the ``corpus.yaml`` that names it.

It is built to exercise every layer: exact duplicates across objects and sources, a CRLF and
trailing-space variant, decomposed Unicode that NFC must fold, grouped dialog threads, one
malformed line and one blank line for quarantine, and zstd plus plain objects.
"""

import json
import random
from pathlib import Path

import zstandard

from corpus_assets.core.fsio import atomic_write

WORDS = (  # noqa: SIM905 - a word list reads best as prose
    "data snapshot manifest digest lineage record source split train model token block "
    "review audit freeze watermark alias gate policy cluster sample mixture corpus shard "
    "river mountain window garden lantern harbor meadow orbit pebble quartz velvet ember "
    "quiet bright careful rapid gentle honest curious patient steady simple"
).split()

CONFIG = """\
# Written by `corpus-assets demo`. Edit freely; unknown keys are errors.
version: 1
purpose: demo-pretraining
alias: demo
sources:
  - id: essays
    kind: objects
    path: demo-sources/essays
  - id: dialogs
    kind: objects
    path: demo-sources/dialogs
    group_field: thread
policies:
  splits: {salt: demo-v1, train_percent: 80, validation_percent: 10, test_percent: 10}
  mixing: {seed: demo-mix-v1}
  packing: {block_tokens: 256}
"""


def _paragraph(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 14))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def demo_objects() -> dict[str, bytes]:
    """Relative path -> exact bytes of every demo object (same bytes on every machine)."""
    rng = random.Random(20261130)
    essays = [{"id": f"e{n:04d}", "text": _paragraph(rng)} for n in range(120)]
    essays[7]["text"] = "Cafe\u0301 notes: " + essays[7]["text"]
    second = [{"id": f"e{n:04d}", "text": _paragraph(rng)} for n in range(120, 200)]
    second[0]["text"] = essays[3]["text"]
    second[1]["text"] = essays[4]["text"] + "  \r\n"
    second[2]["text"] = essays[5]["text"]
    dialogs = []
    for thread in range(30):
        for turn in range(rng.randint(1, 3)):
            dialogs.append(
                {
                    "id": f"t{thread:03d}-{turn}",
                    "thread": f"t{thread:03d}",
                    "text": f"Q: {_paragraph(rng)}\nA: {_paragraph(rng)}",
                }
            )
    dialogs.append({"id": "copied", "thread": "t999", "text": essays[10]["text"]})

    def jsonl(rows: list[dict]) -> bytes:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")

    first_part = jsonl(essays) + b'{"id": "broken", "text": "unterminated\n' + b"\n"
    return {
        "essays/essays-00000.jsonl.zst": zstandard.ZstdCompressor(level=3).compress(first_part),
        "essays/essays-00001.jsonl": jsonl(second),
        "dialogs/dialogs-00000.jsonl": jsonl(dialogs),
    }


def write_demo(home: Path) -> Path:
    """Write the demo sources under ``home/demo-sources`` and ``home/corpus.yaml`` if absent.

    Objects are rewritten only when their bytes differ, so a second demo run leaves the sources'
    fingerprint (and with it the discovery sensor) untouched.
    """
    for relative, data in demo_objects().items():
        path = home / "demo-sources" / relative
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
    config = home / "corpus.yaml"
    if not config.exists():
        atomic_write(config, CONFIG.encode())
    return config
