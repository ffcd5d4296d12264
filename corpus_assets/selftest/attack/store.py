"""What gc and the store walk do with a careless retention policy and
with data that looks like a reference.

- ``attack.5-gc-expires``: two generations activated, ``retention: {keep_generations: 1}``, gc.
  The old generation becomes EXPIRED before its objects go; ``rollback`` to it is refused naming
  the state; what the alias serves keeps every object and verifies.
- ``attack.6-tokenizer-ref-words``: a Hugging Face tokenizer whose vocabulary holds ``digest``,
  ``media`` and ``size`` (trained here on generated English text). The build validates (the
  vocabulary is data, not refs), ``verify`` passes, gc keeps the tokenizer file.
"""

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.lab import Home, Lab

REF_WORDS = ("digest", "media", "size")
SPECIALS = ["<|endoftext|>", "<|pad|>"]


def ref_word_text(docs: int = 3000) -> Iterator[list[str]]:
    """English sentences, each document starting with one of ``REF_WORDS`` (a byte-level BPE
    without prefix space learns a word at a document's start as a token of its own)."""
    nouns = ("archive", "record", "table", "file", "shard", "report", "index", "message")
    for start in range(0, docs, 500):
        yield [
            f"{REF_WORDS[n % 3]} of the {nouns[n % len(nouns)]} is checked (digest, media, "
            "size) before use."
            for n in range(start, start + 500)
        ]


def ref_word_tokenizer() -> bytes:
    """A trained tokenizer.json whose vocabulary has ``REF_WORDS`` as entries (checked)."""
    data = train_byte_level_bpe(ref_word_text(), 1024, SPECIALS)
    vocab = json.loads(data)["model"]["vocab"]
    missing = [word for word in REF_WORDS if word not in vocab]
    if missing:
        raise AssertionError(f"the trained vocabulary lacks {missing}")
    return data


def _snapshots(home: Home) -> dict[str, dict[str, Any]]:
    payload = json.loads(home.must("status", "--json").out)
    return {s["snapshotId"]: s for s in payload["snapshots"]}


@fault(
    "attack.5-gc-expires",
    "031",
    "gc with retention keep_generations 1 after two activated generations",
    "the old generation is EXPIRED (status) before its objects go; rollback to it is refused "
    "naming EXPIRED; the served snapshot keeps every object and verifies",
)
def gc_expires(lab: Lab) -> Outcome:
    home, first = lab.copy_of_reference("gc-expires")
    home.publish(first.snapshot_id)
    second = home.build("--partition", "p2")
    home.publish(second.snapshot_id)
    before = set(_snapshots(home))
    with home.config.open("a") as config:
        config.write("retention: {keep_generations: 1}\n")
    gc = home.cli("gc")
    after = _snapshots(home)
    rollback = home.cli("rollback", first.snapshot_id)
    verify = home.cli("verify", second.snapshot_id)
    old, served = after[first.snapshot_id]["state"], after[second.snapshot_id]["state"]
    return Outcome(
        observed=(
            f"gc exit {gc.code}; {first.partition} {old}, p2 {served}; rollback exit "
            f"{rollback.code}: {rollback.error_line()}; p2 verify exit {verify.code}"
        ),
        matched=gc.code == 0 and old == "EXPIRED" and "EXPIRED" in rollback.err,
        lost=NO_LOSS if verify.code == 0 and served == "ACTIVE" else "the served snapshot",
        digests_equal=set(after) == before,
    )


@fault(
    "attack.6-tokenizer-ref-words",
    "031",
    "a Hugging Face tokenizer whose vocabulary holds the words digest, media and size",
    "the build validates (the vocabulary is data, not refs); verify passes; gc keeps the file",
    catalog=False,
)
def tokenizer_ref_words(lab: Lab) -> Outcome:
    home, reference = lab.copy_of_reference("tokenizer-ref-words")
    data = ref_word_tokenizer()
    path = home.dir / "tokenizer.json"
    path.write_bytes(data)
    policy = {"kind": "huggingface", "path": str(path), "eos": SPECIALS[0], "pad": SPECIALS[1]}
    docs = {"id": "docs", "kind": "objects", "path": str(lab.standard_sources)}
    home.configure([docs], f"policies: {{tokenizer: {json.dumps(policy)}}}\n")
    build = home.cli("build", "--partition", "p3")
    built = [s for s in _snapshots(home).values() if s["partition"] == "p3"]
    state = built[0]["state"] if built else "none"
    verify = home.cli("verify", built[0]["snapshotId"]) if built else None
    garbage = json.loads(home.must("gc", "--dry-run", "--json").out)["objects"]
    kept = "sha256:" + hashlib.sha256(data).hexdigest() not in {o["digest"] for o in garbage}
    original = home.cli("verify", reference.snapshot_id)
    return Outcome(
        observed=(
            f"build exit {build.code} ({state if build.code == 0 else build.error_line()}); "
            f"verify exit "
            f"{verify.code if verify else '-'}; tokenizer kept by gc: {kept}"
        ),
        matched=build.code == 0
        and state == "VALIDATED"
        and verify is not None
        and verify.code == 0
        and kept,
        lost=NO_LOSS if original.code == 0 else f"the reference snapshot {reference.snapshot_id}",
        digests_equal=original.code == 0,
    )
