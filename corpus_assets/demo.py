"""A small, deterministic demo source set and the ``corpus.yaml`` that names it.

It is built to exercise every layer: exact duplicates across objects and sources, a CRLF and
trailing-space variant, a near duplicate (one word changed in a long essay), decomposed Unicode
that NFC must fold, grouped dialog threads, chat
``messages`` records (one with a paired tool call, one with an email address to redact, one that
matches no adapter), one malformed line and one blank line for quarantine, and zstd plus plain
objects.
"""

import json
import random
from pathlib import Path

import zstandard

from corpus_assets.core.storage.fsio import atomic_write

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
  - id: chats
    kind: objects
    path: demo-sources/chats
    adapter: chat-messages.v1
    licence: CC-BY-4.0
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
    # A near duplicate: a long essay and a copy with one word changed (Jaccard about 0.9).
    essays[20]["text"] = " ".join(_paragraph(rng) for _ in range(6))
    edited = essays[20]["text"].split(" ")
    edited[len(edited) // 2] = "unexpectedly"
    second[3]["text"] = " ".join(edited)
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

    chats = [
        {
            "id": f"c{n:03d}",
            "messages": [
                {"role": "user", "content": _paragraph(rng)},
                {"role": "assistant", "content": _paragraph(rng)},
            ],
        }
        for n in range(20)
    ]
    chats[0]["messages"][0]["content"] += " Write to me at ada.lovelace@example.org."
    chats[1]["messages"] = [
        {"role": "user", "content": "What is the weather in Lisbon?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "t1", "name": "weather"}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "18 C and sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny in Lisbon."},
    ]
    chats.append({"id": "not-a-chat", "text": "a row with no messages field"})
    first_part = jsonl(essays) + b'{"id": "broken", "text": "unterminated\n' + b"\n"
    return {
        "essays/essays-00000.jsonl.zst": zstandard.ZstdCompressor(level=3).compress(first_part),
        "essays/essays-00001.jsonl": jsonl(second),
        "dialogs/dialogs-00000.jsonl": jsonl(dialogs),
        "chats/chats-00000.jsonl": jsonl(chats),
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
