"""Indexing benchmark items for containment screening: what ``BenchmarkIndex.build`` computes.

Built once per reference set and consulted for every record, so the structures are shaped for
the record side: per n-gram mode, the sorted unique 64-bit n-gram hashes of all items, their
postings (which items hold each hash) and a bitmap of 16 one-byte slots per benchmark n-gram
(~6% false positives) that rejects most record windows before any ``searchsorted``. Memory is
the keys, postings and bitmap (~36 bytes per distinct benchmark n-gram, at least 64 KiB) plus
the normalised item texts, independent of corpus size. Per item the exact n-gram count and its
intra-item hash collision count (the *deficit*, almost always 0) are kept so screening can
bound ``|A & B|`` from hash hits alone.
"""

import itertools
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.records.contamination import (
    INDEX_FORMAT,
    ContaminationPolicy,
    item_mode,
    ngram_size,
    ngrams,
    policy_payload,
)
from corpus_assets.core.records.contamination_stream import (
    EMPTY,
    Stream,
    batches,
    normalise_stream,
)
from corpus_assets.core.storage.digests import json_digest, sha256_digest

MODES = ("word", "char")


@dataclass(frozen=True)
class NgramTable:
    """Sorted unique n-gram hashes, their postings (item indexes) and the screening bitmap."""

    keys: np.ndarray  # uint64, sorted, unique
    ptr: np.ndarray  # int64, len(keys) + 1: postings of keys[k] are post[ptr[k]:ptr[k+1]]
    post: np.ndarray  # int32 item indexes
    bits: np.ndarray  # bool, 2**b entries, indexed by the top b bits of a hash
    shift: int

    @classmethod
    def build(cls, hashes: np.ndarray, items: np.ndarray) -> "NgramTable":
        """The table of (hash, item index) pairs, duplicates across items kept as postings."""
        order = np.lexsort((items, hashes))
        hashes, items = hashes[order], items[order]
        keys, first = np.unique(hashes, return_index=True)
        b = max(16, (16 * keys.size - 1).bit_length())
        bits = np.zeros(1 << b, dtype=bool)
        bits[keys >> np.uint64(64 - b)] = True
        ptr = np.append(first, hashes.size).astype(np.int64)
        return cls(keys, ptr, items.astype(np.int32), bits, 64 - b)

    def probe(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(window indexes whose hash is a key, key indexes); the bitmap keeps this cheap."""
        if not self.keys.size or not h.size:
            return EMPTY, EMPTY
        cand = self.bits[h >> np.uint64(self.shift)].nonzero()[0]
        if not cand.size:
            return EMPTY, EMPTY
        hc = h[cand]
        k = np.minimum(np.searchsorted(self.keys, hc), self.keys.size - 1)
        found = self.keys[k] == hc
        return cand[found], k[found]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ptr.nbytes + self.post.nbytes + self.bits.nbytes


@dataclass(frozen=True)
class IndexedItems:
    """Everything a ``BenchmarkIndex`` holds about its items, indexed by sorted item id."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]  # normalised
    modes: np.ndarray  # int8: 0 unchecked, 1 word, 2 char
    sizes: np.ndarray  # int64: exact n-gram count
    deficits: np.ndarray  # int64: exact n-grams minus distinct hashes
    tables: dict[str, NgramTable]
    digest: str
    unchecked: tuple[str, ...]


def index_items(items: Iterable[tuple[str, str]], policy: ContaminationPolicy) -> IndexedItems:
    """Index ``(item_id, text)`` pairs; the result does not depend on their order."""
    pairs = _checked_pairs(items)
    ids = tuple(item_id for item_id, _ in pairs)
    all_texts = [text for _, text in pairs]
    builder = _Builder(len(ids), policy)
    for lo, hi in batches(all_texts):
        builder.add_batch(lo, all_texts[lo:hi])
    texts = tuple(builder.texts)
    unchecked = tuple(i for i, m in zip(ids, builder.modes, strict=True) if m == 0)
    return IndexedItems(
        ids,
        texts,
        builder.modes,
        builder.sizes,
        builder.deficits,
        builder.tables(),
        _digest(ids, texts, policy),
        unchecked,
    )


def _checked_pairs(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The items sorted by id, refusing non-string pairs and repeated ids."""
    pairs = sorted(items)
    for item_id, text in pairs:
        if not isinstance(item_id, str) or not isinstance(text, str):
            raise TypeError(f"benchmark items are (str id, str text) pairs: {item_id!r}")
    for a, b in itertools.pairwise(item_id for item_id, _ in pairs):
        if a == b:
            raise ValueError(f"benchmark item id {a!r} is given twice")
    return pairs


def _item_hashes(
    stream: Stream, count: int, mode: str, policy: ContaminationPolicy
) -> list[np.ndarray]:
    """Per text of the stream, the hashes of its ``mode`` n-grams (duplicates kept)."""
    h, spans = stream.windows(mode, ngram_size(mode, policy))
    ok, rec = stream.valid(*spans(np.arange(h.size)))
    rec, h = rec[ok], h[ok]
    order = np.argsort(rec, kind="stable")
    rec, h = rec[order], h[order]
    cuts = np.searchsorted(rec, np.arange(count + 1))
    return [h[cuts[r] : cuts[r + 1]] for r in range(count)]


class _Builder:
    """Per-item fields and per-mode (hashes, item indexes), accumulated batch by batch."""

    def __init__(self, count: int, policy: ContaminationPolicy) -> None:
        self.policy = policy
        self.texts: list[str] = []
        self.modes = np.zeros(count, dtype=np.int8)
        self.sizes = np.zeros(count, dtype=np.int64)
        self.deficits = np.zeros(count, dtype=np.int64)
        self.grams: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
            mode: ([], []) for mode in MODES
        }

    def add_batch(self, lo: int, texts: Sequence[str]) -> None:
        """Items ``lo .. lo + len(texts) - 1``, normalised and hashed as one stream."""
        stream = normalise_stream(texts)
        hashes = {mode: _item_hashes(stream, len(texts), mode, self.policy) for mode in MODES}
        for r in range(len(texts)):
            text = stream.text(r)
            self.texts.append(text)
            mode = item_mode(text, self.policy)
            if mode is not None:
                self._add_item(lo + r, text, mode, hashes[mode][r])

    def _add_item(self, index: int, text: str, mode: str, hashes: np.ndarray) -> None:
        """One checkable item: its exact n-gram count, deficit and distinct hashes."""
        self.modes[index] = 1 if mode == "word" else 2
        exact = ngrams(text, mode, self.policy)
        distinct = np.unique(hashes)
        self.sizes[index] = len(exact)
        self.deficits[index] = len(exact) - distinct.size
        self.grams[mode][0].append(distinct)
        self.grams[mode][1].append(np.full(distinct.size, index, dtype=np.int32))

    def tables(self) -> dict[str, NgramTable]:
        """One :class:`NgramTable` per mode (empty when no item uses the mode)."""
        return {
            mode: NgramTable.build(
                np.concatenate(hs) if hs else np.empty(0, dtype=np.uint64),
                np.concatenate(its) if its else np.empty(0, dtype=np.int32),
            )
            for mode, (hs, its) in self.grams.items()
        }


def _digest(ids: tuple[str, ...], texts: tuple[str, ...], policy: ContaminationPolicy) -> str:
    """sha256 over policy, Unicode version and (id, normalised text digest) of every item."""
    return json_digest(
        {
            "format": INDEX_FORMAT,
            "policy": policy_payload(policy),
            "unicode": unicodedata.unidata_version,
            "items": [
                [i, sha256_digest(t.encode("utf-8"))] for i, t in zip(ids, texts, strict=True)
            ],
        }
    )
