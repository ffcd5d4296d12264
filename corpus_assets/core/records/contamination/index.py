"""``TokenIndex``: the matching engine (rules in :mod:`.rules`).

Four hashed tables, each of :class:`.tables.NgramTable` (sorted 64-bit keys,
postings, screening bitmap): ``word`` (token n-grams of long spaced items), ``char`` (letter
n-grams of long unspaced items), and for short items checked whole, ``word_head`` /
``char_head``: the hash of the item's first ``min_whole_tokens`` tokens (``min_whole_chars``
letters), so one extra window size finds every place a short item could start. Records are
tokenised a batch at a time (:mod:`.tokens`; a text longer than ``WINDOW_CHARS``
alone, in overlapping windows: :mod:`.windows`) and every window of a table's
size is probed; each hit is confirmed on the real strings (n-gram set membership, or the whole
item at that position), so the hash decides nothing: a collision costs a comparison, and an
equal string always has the equal hash, so nothing is missed.
"""

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.records.contamination.rules import (
    INDEX_FORMAT,
    NGRAM,
    PPM,
    WHOLE,
    Match,
    TokenPolicy,
    ngrams,
    plan,
)
from corpus_assets.core.records.contamination.stream import Stream, batches
from corpus_assets.core.records.contamination.tables import NgramTable, checked_pairs
from corpus_assets.core.records.contamination.tokens import (
    letter_stream,
    single_stream,
    token_stream,
)
from corpus_assets.core.records.contamination.windows import (
    WINDOW_CHARS,
    folded_windows,
    holds_unspaced,
)
from corpus_assets.core.storage.digests import json_digest, sha256_digest

_SINGLE_CHARS = 1 << 12
_EMPTY_KEYS = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True)
class _Table:
    """One probe: windows of ``n`` over the token (``word``) or letter (``char``) stream."""

    kind: str
    n: int
    head: bool  # True: a hit is a short item's start, confirmed whole


def _tables(policy: TokenPolicy) -> dict[str, _Table]:
    return {
        "word": _Table("word", policy.ngram_words, False),
        "word_head": _Table("word", policy.min_whole_tokens, True),
        "char": _Table("char", policy.ngram_chars, False),
        "char_head": _Table("char", policy.min_whole_chars, True),
    }


def _window_hashes(stream: Stream, count: int, kind: str, n: int) -> list[np.ndarray]:
    """Per text, the hashes of its windows in position order (duplicates kept)."""
    h, spans = stream.windows(kind, n)
    ok, rec = stream.valid(*spans(np.arange(h.size)))
    rec, h = rec[ok], h[ok]
    cuts = np.searchsorted(rec, np.arange(count + 1))  # windows are in stream order
    return [h[cuts[r] : cuts[r + 1]] for r in range(count)]


class TokenIndex:
    """Benchmark items indexed for matching; build with :meth:`build`."""

    def __init__(self, policy: TokenPolicy, ids: tuple[str, ...], texts: tuple[str, ...]) -> None:
        self.policy = policy
        self.ids = ids
        self.texts = texts  # normalised (tokens joined by one space)
        self.hows = np.zeros(len(ids), dtype=np.int8)
        self.sizes = np.zeros(len(ids), dtype=np.int64)  # exact n-gram count (NGRAM items)
        self.specs = _tables(policy)
        self.tables: dict[str, NgramTable] = {}
        self.digest = json_digest(
            {
                "format": INDEX_FORMAT,
                "policy": policy.payload(),
                "unicode": unicodedata.unidata_version,
                "items": [[i, sha256_digest(t.encode())] for i, t in zip(ids, texts, strict=True)],
            }
        )

    @classmethod
    def build(cls, items: Iterable[tuple[str, str]], policy: TokenPolicy) -> "TokenIndex":
        """Index ``(item_id, text)`` pairs; the result does not depend on their order."""
        pairs = checked_pairs(items)
        raw = [text for _, text in pairs]
        grams: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        texts: list[str] = []
        hows, sizes = [], []
        for lo, hi in batches(raw):
            stream = token_stream(raw[lo:hi])
            letters = letter_stream(stream) or stream  # (no unspaced item in the batch)
            for r in range(hi - lo):
                texts.append(stream.text(r))
                mode, how = plan(texts[-1], policy)
                hows.append(how)
                sizes.append(len(ngrams(texts[-1], mode, _tables(policy)[mode].n)))
            cls._add_batch(policy, stream, letters, lo, hows[lo:hi], texts[lo:hi], grams)
        index = cls(policy, tuple(item_id for item_id, _ in pairs), tuple(texts))
        index.hows[:] = hows
        index.sizes[:] = sizes
        for name, (hs, its) in grams.items():
            index.tables[name] = NgramTable.build(np.concatenate(hs), np.concatenate(its))
        return index

    @staticmethod
    def _add_batch(
        policy: TokenPolicy,
        stream: Stream,
        letters: Stream,
        lo: int,
        hows: list[int],
        texts: list[str],
        grams: dict[str, tuple[list[np.ndarray], list[np.ndarray]]],
    ) -> None:
        """The hashes of one batch of items into ``grams`` (per table: hashes, item indexes)."""
        for name, spec in _tables(policy).items():
            source = stream if spec.kind == "word" else letters
            per_text = _window_hashes(source, len(texts), spec.kind, spec.n)
            for r, hashes in enumerate(per_text):
                mode, how = plan(texts[r], policy)
                if mode != spec.kind or how != (WHOLE if spec.head else NGRAM):
                    continue
                keep = np.unique(hashes[:1] if spec.head else hashes)
                hs, its = grams.setdefault(name, ([], []))
                hs.append(keep)
                its.append(np.full(keep.size, lo + r, dtype=np.int32))

    def match_many(self, texts: Sequence[str], window: int = WINDOW_CHARS) -> list[Match | None]:
        """Per text, the best confirmed match (highest containment, ties: smallest item id); a
        text longer than ``window`` characters is screened in windows (same result)."""
        results: list[Match | None] = [None] * len(texts)
        if not self.tables:
            return results
        short = [i for i, text in enumerate(texts) if len(text) <= window]
        for lo, hi in batches([texts[i] for i in short]):
            batch = short[lo:hi]
            found = self._evidence(self._stream([texts[i] for i in batch]))
            for r, match in enumerate(self._best(found, len(batch))):
                results[batch[r]] = match
        for i, text in enumerate(texts):
            if len(text) > window:
                results[i] = self._best(self._windowed(text, window), 1)[0]
        return results

    @staticmethod
    def _stream(texts: list[str]) -> Stream:
        if len(texts) == 1 and len(texts[0]) < _SINGLE_CHARS:
            return single_stream(texts[0])  # fewer numpy calls for one short text
        return token_stream(texts)

    def _windowed(self, text: str, window: int) -> dict[tuple[int, int], set[str] | None]:
        """The evidence of one long text, gathered window by window (n-grams seen twice in an
        overlap count once: the shared sets are unioned)."""
        every = holds_unspaced(text, window)
        evidence: dict[tuple[int, int], set[str] | None] = {}
        p = self.policy
        for part in folded_windows(text, window, p.ngram_words, p.ngram_chars):
            stream = token_stream([part], folded=True)
            for key, seen in self._evidence(stream, every=every).items():
                if key not in evidence or seen is None:
                    evidence[key] = seen
                elif evidence[key] is not None:
                    evidence[key] |= seen
        return evidence

    def _evidence(
        self, stream: Stream, every: bool = False
    ) -> dict[tuple[int, int], set[str] | None]:
        """(record, item) -> the item's n-grams the record shares (None: the whole item found).
        ``every``: the letter stream is built (windows of a text holding an unspaced letter)."""
        evidence: dict[tuple[int, int], set[str] | None] = {}
        letters: Stream | None = None
        built = False
        for name, table in self.tables.items():
            spec = self.specs[name]
            source = stream
            if spec.kind == "char":
                if not built:
                    letters, built = letter_stream(stream, every=every), True
                if letters is None:  # no text of the batch holds an unspaced-script character
                    continue
                source = letters
            for r, item, seen in self._hits(source, table, spec):
                evidence[(r, item)] = seen
        return evidence

    def _best(
        self, evidence: dict[tuple[int, int], set[str] | None], count: int
    ) -> list[Match | None]:
        """Per record, the match of highest containment (ties: smallest item index)."""
        best: dict[int, tuple[int, int, int]] = {}  # record -> (-ppm, item, shared)
        for (r, item), seen in evidence.items():
            shared = 0 if seen is None else len(seen)
            ppm = PPM if seen is None else shared * PPM // int(self.sizes[item])
            key = (-ppm, item, shared)
            if r not in best or key < best[r]:
                best[r] = key
        results: list[Match | None] = [None] * count
        for r, (neg_ppm, item, shared) in best.items():
            whole = int(self.hows[item]) == WHOLE
            results[r] = Match(self.ids[item], -neg_ppm, shared=shared, whole=whole)
        return results

    def _hits(
        self, stream: Stream, table: NgramTable, spec: _Table
    ) -> list[tuple[int, int, set[str] | None]]:
        """Confirmed (record, item, shared n-grams; None for a whole item) of one table."""
        h, spans = stream.windows(spec.kind, spec.n)
        windows_, keys = table.probe(h)
        if not windows_.size:
            return []
        start, end = spans(windows_)
        ok, rec = stream.valid(start, end)
        start, end, rec, keys = start[ok], end[ok], rec[ok], keys[ok]
        lengths = table.ptr[keys + 1] - table.ptr[keys]
        at = np.repeat(np.arange(keys.size), lengths)
        firsts = np.repeat(table.ptr[keys] - np.cumsum(lengths) + lengths, lengths)
        items = table.post[firsts + np.arange(at.size)].astype(np.int64)
        # group the hit windows by (record, item): one confirmation per pair
        pair = rec[at].astype(np.int64) * len(self.ids) + items
        if not pair.size:  # every hit crossed two texts
            return []
        order = np.argsort(pair, kind="stable")
        pair, at = pair[order], at[order]
        cuts = np.flatnonzero(np.diff(pair)) + 1
        starts = (start[at] - stream.off[rec[at]] - 1).tolist()
        ends = (end[at] - stream.off[rec[at]] - 1).tolist()
        texts: dict[int, str] = {}
        grams: dict[int, set[str]] = {}
        confirmed = []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), pair.size], strict=True):
            r, item = divmod(int(pair[lo]), len(self.ids))
            if r not in texts:
                texts[r] = stream.text(r)
            text = texts[r]
            if spec.head:
                if self._whole_at(text, starts[lo:hi], item, spec.kind):
                    confirmed.append((r, item, None))
                continue
            if item not in grams:
                grams[item] = ngrams(self.texts[item], spec.kind, spec.n)
            seen = {text[a:b] for a, b in zip(starts[lo:hi], ends[lo:hi], strict=True)}
            shared = seen & grams[item]
            if shared:
                confirmed.append((r, item, shared))
        return confirmed

    def _whole_at(self, text: str, positions: list[int], item: int, kind: str) -> bool:
        """The whole item at one of ``positions`` of the record (word: ending at a token end)."""
        target = self.texts[item] if kind == "word" else self.texts[item].replace(" ", "")
        for p in positions:
            if text.startswith(target, p):
                end = p + len(target)
                if kind == "char" or end == len(text) or text[end] == " ":
                    return True
        return False
