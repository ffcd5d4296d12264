"""Where CAS references live: declared per typed document kind, never guessed from content.

Every JSON document this project writes names its kind in ``schema`` (``corpus.layer.v1``, ...);
``DECLARED`` lists, per kind, the fields that hold refs and what each ref points at:

- ``TYPED``: another such document, walked in turn by its own declaration;
- ``BY_MEDIA``: a typed document if its media is JSON, else an opaque object (a members or
  dedup clusters table stored whole, as snapshots before parts name it, or its parts document);
- ``LEAF``: an opaque object - a table, shard, array, or a JSON file that is data, not a
  document of ours (a Hugging Face ``tokenizer.json``, the dedup report, the shard index) -
  re-hashed by ``verify`` and kept by gc, never read for references.

A field path is dotted: ``*`` is any key of a dict, ``name[]`` every item of the list ``name``.
Anything else in a document is data: a vocabulary with the words ``digest``, ``media`` and
``size`` is not a ref. So that a kind's declaration cannot silently fall behind the code that
writes it (verify would then skip objects, and gc delete them), a well-formed ref found at an
undeclared field is a finding, as is a document of unknown kind where a typed one is declared.
"""

import re
from collections.abc import Iterator
from typing import Any

from corpus_assets.core.storage.artifacts import Ref

TYPED, LEAF, BY_MEDIA = "typed", "leaf", "by-media"
MANIFEST_KIND = "training.dataset.snapshot.v1"
LAYER_KIND = "corpus.layer.v1"  # declared per layer: ``corpus.layer.v1/<layer>``
_TOKENS = (("token_cache[].tokens", TYPED), ("tokenizer.file", LEAF))  # the spec inline
_LAYER_OUTPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "raw_snapshot": (("objects[].object", LEAF),),  # the pinned source objects
    "canonical_records": (("chunks[].output", TYPED),),  # corpus.chunk.v3 (or v2) per object
    "dedup_clusters": (
        ("clusters", BY_MEDIA),  # its parts document; a table stored whole before parts
        ("edges", LEAF),
        ("report", LEAF),  # a JSON document of figures, no refs
        ("signatures[].signatures", LEAF),
        ("pairs", LEAF),  # verified pairs: text digests and Jaccard, reused by a child
        ("lengths[].lengths", LEAF),  # per chunk: its texts' lengths, reused by a child
        ("decisions", LEAF),  # per row: verdict, rows it names, position; reused by a child
        ("bands[].index", LEAF),  # per class: every band's records in bucket order
    ),
    "splits": (
        ("splits", LEAF),
        ("split_moves", LEAF),
        ("split_conflicts", LEAF),
        ("heldout_pairs", LEAF),
        ("heldout_verified", LEAF),  # verified held-out pairs: text digests and Jaccard
        ("heldout_state", LEAF),  # per row: its part in the search, its estimated pairs
        *_TOKENS,
    ),
    "mixed_samples": (("samples", LEAF), *_TOKENS),
    "packed_blocks": (
        ("shard_index", LEAF),  # names its shards by digest; the index lists their refs
        ("shards[]", LEAF),
        ("spans", LEAF),
        ("quarantined", LEAF),
        ("layout", LEAF),  # corpus.packed-layout.v1 holds no refs
        ("shard_counts", LEAF),  # label and special tokens per shard
        *_TOKENS,
    ),
}
DECLARED: dict[str, tuple[tuple[str, str], ...]] = {
    MANIFEST_KIND: (
        ("freeze", TYPED),
        ("layers.*", TYPED),
        ("members", BY_MEDIA),
        ("tokenizer.file", LEAF),
    ),
    "corpus.members-parts.v1": (("parts[]", LEAF),),
    "corpus.clusters-parts.v1": (("parts[]", LEAF),),
    "corpus.freeze.v1": (),
    **{
        f"{LAYER_KIND}/{layer}": (
            ("inputs[]", TYPED),
            # a parent snapshot's index: re-hashed and kept, never walked - its closure is the
            # parent's, so a snapshot's closure does not run on through every ancestor's tables
            ("parents[]", LEAF),
            *((f"outputs.{path}", target) for path, target in outputs),
        )
        for layer, outputs in _LAYER_OUTPUTS.items()
    },
    "corpus.chunk.v2": (("records", LEAF), ("excluded", LEAF)),
    "corpus.chunk.v3": (("pieces[].records", LEAF), ("excluded", LEAF)),
    "corpus.tokens.v2": (("ids", LEAF), ("targets", LEAF), ("offsets", LEAF), ("pairSplit", LEAF)),
    "corpus.tokenizer.v1": (("file", LEAF),),
    "corpus.packed-layout.v1": (),
}
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def is_well_formed(value: Any) -> bool:
    """A ref by its types: a sha256 digest string, a media string and a byte count."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("digest"), str)
        and _DIGEST.match(value["digest"]) is not None
        and isinstance(value.get("media"), str)
        and isinstance(value.get("size"), int)
        and not isinstance(value["size"], bool)
        and value["size"] >= 0
    )


def kind_of(document: Any) -> str | None:
    """The declared kind of a parsed document, None if it is not one of ours."""
    if not isinstance(document, dict):
        return None
    kind = document.get("schema")
    if kind == LAYER_KIND:
        kind = f"{LAYER_KIND}/{document.get('layer')}"
    return kind if isinstance(kind, str) and kind in DECLARED else None


def declared_refs(document: Any) -> tuple[list[tuple[str, Ref, str]], list[str]]:
    """Each ref a typed document declares, as (field path, ref, TYPED or LEAF), and findings: an
    unknown kind, a declared field that is no well-formed ref, a ref at an undeclared field."""
    kind = kind_of(document)
    if kind is None:
        schema = document.get("schema") if isinstance(document, dict) else type(document).__name__
        return [], [f"not a document of a declared kind (schema {schema!r})"]
    found: list[tuple[str, Ref, str]] = []
    findings: list[str] = []
    for pattern, target in DECLARED[kind]:
        for path, value in _select(document, pattern.split("."), ""):
            if value is None:
                continue
            if is_well_formed(value):
                found.append((path, value, target))
            else:
                findings.append(f"{kind} field {path} is not a well-formed ref")
    declared = {path for path, _, _ in found}
    findings += [
        f"{kind} names a ref at {path}, a field its kind does not declare"
        for path in _ref_paths(document, "")
        if path not in declared
    ]
    return found, findings


def _select(node: Any, parts: list[str], path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every field ``parts`` (a split pattern) names under ``node``."""
    if not parts:
        yield path, node
        return
    head, rest = parts[0], parts[1:]
    if not isinstance(node, dict):
        return
    if head == "*":
        for key, value in node.items():
            yield from _select(value, rest, f"{path}.{key}")
    elif head.endswith("[]"):
        items = node.get(head[:-2])
        for n, item in enumerate(items if isinstance(items, list) else []):
            yield from _select(item, rest, f"{path}.{head[:-2]}[{n}]")
    elif head in node:
        yield from _select(node[head], rest, f"{path}.{head}")


def _ref_paths(node: Any, path: str) -> Iterator[str]:
    """Paths of the well-formed refs anywhere in ``node`` (to check them against ``DECLARED``;
    never followed)."""
    if is_well_formed(node):
        yield path
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _ref_paths(value, f"{path}.{key}")
    elif isinstance(node, list):
        for n, value in enumerate(node):
            yield from _ref_paths(value, f"{path}[{n}]")
