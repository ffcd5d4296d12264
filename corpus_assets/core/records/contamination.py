"""Benchmark decontamination by n-gram containment (seed 000, 18.3; Broder 1997).

A training record is contaminated by a benchmark item when most of the item's n-grams occur in
the record: containment ``C(A, B) = |A & B| / |A|`` with ``A`` the item's n-gram set and ``B``
the record's. Jaccard ``|A & B| / |A | B|`` is the wrong measure here: a 30-word question pasted
into a 5,000-word page has containment 1 and Jaccard below 1%.

Normalisation (:func:`normalise`, shared by items and records): NFC, casefold, split on
whitespace (``str.split``), strip Unicode punctuation (general category ``P*``) from both ends of
every token, drop tokens left empty, join with one space. Punctuation inside a token stays
(``e.g`` , ``don't``, ``3.14``). Word n-grams are ``ngram_words`` consecutive tokens; character
n-grams are ``ngram_chars`` consecutive characters of the normalised text (spaces included).

An item uses character n-grams when at least half of its non-space characters belong to scripts
written without spaces (CJK, kana, Thai, Lao, Khmer, Myanmar, Tibetan) or when it has fewer than
``ngram_words`` tokens; an item that then has fewer than ``ngram_chars`` characters cannot be
checked by this method and is listed in :attr:`BenchmarkIndex.unchecked` (so a gate report can
say what was not checked) instead of being dropped silently. Records are n-grammed both ways.
As seed 000 asks, ``None`` from :meth:`BenchmarkIndex.match` means "no match with this method,
policy and reference set", not "not contaminated".

Speed: the common record matches nothing, so the record path is vectorised (numpy) and ends at a
bitmap probe: normalise a batch of records into one code-point stream, hash every n-gram with a
polynomial rolling hash mod 2**64 from prefix sums (position independent via the inverse of the
odd base), look the top bits up in a bitmap of 16 one-byte slots per benchmark n-gram (~6%
false positives), and only the survivors go to an exact ``searchsorted`` on the sorted 64-bit
keys. Records are hashed in a mode only when some item uses it. Per (record, item) the
number of item n-gram hashes seen is an upper bound of ``|A & B|`` (plus the item's own
intra-item collision count, almost always 0); only items whose bound reaches the threshold are
confirmed with the real n-gram strings, so hash collisions cost time, never a false match or a
missed one. Memory is the keys, postings and bitmap (~36 bytes per distinct benchmark n-gram,
at least 64 KiB) plus the normalised item texts, independent of corpus size. Working memory of a
call is proportional to its batch (~256k characters; a longer record is processed alone, at
~50 bytes per character).

Use :meth:`BenchmarkIndex.match_many` for a chunk of records: :meth:`~BenchmarkIndex.match`
pays the fixed cost of a few dozen numpy calls per record.
"""

import bisect
import functools
import itertools
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from corpus_assets.core.storage.digests import json_digest, sha256_digest

INDEX_FORMAT = "contamination.index.v1"  # bump when normalisation or n-gram rules change
PPM = 1_000_000
_WORD, _SPACE, _PUNCT = 0, 1, 2
_BASE = 0x9E3779B97F4A7C15  # odd, so it is invertible mod 2**64
_BATCH_CHARS = 1 << 18
_SINGLE_CHARS = 1 << 12
_NO_SPACE_SCRIPTS = re.compile(
    "[\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]"
)


@dataclass(frozen=True)
class ContaminationPolicy:
    """Integers only: the policy is hashed into task keys, and hashed payloads carry no floats.

    ``threshold_ppm`` is containment in parts per million; a record is contaminated at or above
    it (so 1_000_000 means "every n-gram of the item occurs in the record").
    """

    version: str = "contamination.v1"
    ngram_words: int = 13
    ngram_chars: int = 50
    threshold_ppm: int = 500_000

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ValueError("contamination policy version must be a non-empty string")
        for name in ("ngram_words", "ngram_chars", "threshold_ppm"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"contamination policy {name} must be a positive int: {value!r}")
        if self.threshold_ppm > PPM:
            raise ValueError(f"threshold_ppm {self.threshold_ppm} is above {PPM}")


def policy_payload(policy: ContaminationPolicy) -> dict:
    """The policy as a hashable JSON object (field names as in the config's policy dumps)."""
    return asdict(policy)


@dataclass(frozen=True)
class Match:
    """The benchmark item a record is excluded for (reason ``contamination.benchmark``)."""

    item_id: str
    containment_ppm: int


def normalise(text: str) -> str:
    """The reference definition of the normalisation; batches use a vectorised equivalent.

    (A token with alphanumeric ends needs no strip: skipping it is only a shortcut.)
    """
    punct = _punctuation()
    tokens = (
        t if t[0].isalnum() and t[-1].isalnum() else t.strip(punct)
        for t in unicodedata.normalize("NFC", text).casefold().split()
    )
    return " ".join(t for t in tokens if t)


def word_ngrams(normalised: str, n: int) -> set[str]:
    tokens = normalised.split(" ") if normalised else []
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def char_ngrams(normalised: str, n: int) -> set[str]:
    return {normalised[i : i + n] for i in range(len(normalised) - n + 1)}


def containment_ppm(item_grams: set[str], record_grams: set[str]) -> int:
    """``|A & B| / |A|`` in ppm, rounded down; 0 for an empty item."""
    if not item_grams:
        return 0
    return len(item_grams & record_grams) * PPM // len(item_grams)


@dataclass(frozen=True)
class _Table:
    """Sorted unique n-gram hashes, their postings (item indexes) and the screening bitmap."""

    keys: np.ndarray  # uint64, sorted, unique
    ptr: np.ndarray  # int64, len(keys) + 1: postings of keys[k] are post[ptr[k]:ptr[k+1]]
    post: np.ndarray  # int32 item indexes
    bits: np.ndarray  # bool, 2**b entries, indexed by the top b bits of a hash
    shift: int

    @classmethod
    def build(cls, hashes: np.ndarray, items: np.ndarray) -> "_Table":
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
            return _EMPTY, _EMPTY
        cand = self.bits[h >> np.uint64(self.shift)].nonzero()[0]
        if not cand.size:
            return _EMPTY, _EMPTY
        hc = h[cand]
        k = np.minimum(np.searchsorted(self.keys, hc), self.keys.size - 1)
        found = self.keys[k] == hc
        return cand[found], k[found]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ptr.nbytes + self.post.nbytes + self.bits.nbytes


_EMPTY = np.empty(0, dtype=np.int64)
_NO_HASHES = np.empty(0, dtype=np.uint64)
_Spans = tuple[np.ndarray, np.ndarray]


def _no_spans(w: np.ndarray) -> _Spans:
    return _EMPTY, _EMPTY


@dataclass
class _Stream:
    """A batch of texts normalised into one code-point stream.

    Text ``r`` is ``out[off[r] + 1 : off[r + 1]]``; each non-empty text starts with one space,
    so every token in the stream is preceded by exactly one space.
    """

    out: np.ndarray
    off: np.ndarray
    prefix: np.ndarray  # uint64 prefix sums of out[t] * BASE**t, len(out) + 1

    @classmethod
    def of(cls, out: np.ndarray, off: np.ndarray) -> "_Stream":
        powers, _ = _powers(out.size)
        prefix = np.empty(out.size + 1, dtype=np.uint64)
        prefix[0] = 0
        terms = prefix[1:]
        np.multiply(out, powers[: out.size], out=terms)
        np.cumsum(terms, out=terms)
        return cls(out, off, prefix)

    @classmethod
    def single(cls, text: str) -> "_Stream":
        """One text through :func:`normalise`: fewer numpy calls than the batch path."""
        normalised = normalise(text)
        if not normalised:
            return cls.of(np.empty(0, dtype=np.uint8), np.zeros(2, dtype=np.int64))
        return cls.of(_code_points(" " + normalised), np.array([0, len(normalised) + 1]))

    def text(self, r: int) -> str:
        chunk = self.out[self.off[r] + 1 : self.off[r + 1]]
        if chunk.dtype == np.uint8:
            return chunk.tobytes().decode("ascii")
        return chunk.astype("<u4").tobytes().decode("utf-32-le")

    def records_of(self, starts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.off, starts, side="right") - 1

    def windows(self, mode: str, n: int) -> tuple[np.ndarray, Callable[[np.ndarray], _Spans]]:
        """Hashes of every ``mode`` n-gram window of the stream (crossing texts too: callers
        check :meth:`valid` on the few that hit) and a function from window indexes to spans.
        """
        if mode == "char":
            m = self.out.size - n + 1
            if m <= 0:
                return _NO_HASHES, _no_spans
            _, inverse = _powers(m)
            h = self.prefix[n:] - self.prefix[:-n]
            h *= inverse[:m]
            return h, lambda w: (w, w + n)
        spaces = (self.out == 32).nonzero()[0]  # one before every token
        m = spaces.size - n + 1
        if m <= 0:
            return _NO_HASHES, _no_spans
        start = spaces[:m] + 1
        end = np.append(spaces[n:], self.out.size)
        _, inverse = _powers(self.out.size + 1)
        h = self.prefix[end] - self.prefix[start]
        h *= inverse[start]
        return h, lambda w: (start[w], end[w])

    def valid(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask, record) for windows: inside one text, not starting at its leading space."""
        rec = self.records_of(start)
        return (start > self.off[rec]) & (end <= self.off[rec + 1]), rec


class BenchmarkIndex:
    """Benchmark items indexed for containment matching; build with :meth:`build`."""

    def __init__(
        self,
        policy: ContaminationPolicy,
        ids: tuple[str, ...],
        texts: tuple[str, ...],
        modes: np.ndarray,
        sizes: np.ndarray,
        deficits: np.ndarray,
        tables: dict[str, _Table],
        digest: str,
        unchecked: tuple[str, ...],
    ) -> None:
        self.policy = policy
        self._ids = ids
        self._texts = texts
        self._modes = modes
        self._sizes = sizes
        self._deficits = deficits
        self._tables = tables
        self._digest = digest
        self._unchecked = unchecked

    @classmethod
    def build(
        cls, items: Iterable[tuple[str, str]], policy: ContaminationPolicy
    ) -> "BenchmarkIndex":
        """Index ``(item_id, text)`` pairs; the result does not depend on their order."""
        pairs = sorted(items)
        for item_id, text in pairs:
            if not isinstance(item_id, str) or not isinstance(text, str):
                raise TypeError(f"benchmark items are (str id, str text) pairs: {item_id!r}")
        ids = tuple(item_id for item_id, _ in pairs)
        for a, b in itertools.pairwise(ids):
            if a == b:
                raise ValueError(f"benchmark item id {a!r} is given twice")
        texts: list[str] = []
        modes = np.zeros(len(ids), dtype=np.int8)  # 0 unchecked, 1 word, 2 char
        sizes = np.zeros(len(ids), dtype=np.int64)
        deficits = np.zeros(len(ids), dtype=np.int64)
        grams: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
            "word": ([], []),
            "char": ([], []),
        }
        for lo, hi in _batches([text for _, text in pairs]):
            stream = _normalise_stream([text for _, text in pairs[lo:hi]])
            per_item: dict[str, list[np.ndarray]] = {}
            for mode in ("word", "char"):
                h, spans = stream.windows(mode, _size(mode, policy))
                ok, rec = stream.valid(*spans(np.arange(h.size)))
                rec, h = rec[ok], h[ok]
                order = np.argsort(rec, kind="stable")
                rec, h = rec[order], h[order]
                cuts = np.searchsorted(rec, np.arange(hi - lo + 1))
                per_item[mode] = [h[cuts[r] : cuts[r + 1]] for r in range(hi - lo)]
            for r in range(hi - lo):
                index = lo + r
                text = stream.text(r)
                texts.append(text)
                mode = _mode(text, policy)
                if mode is None:
                    continue
                modes[index] = 1 if mode == "word" else 2
                exact = _ngrams(text, mode, policy)
                distinct = np.unique(per_item[mode][r])
                sizes[index] = len(exact)
                deficits[index] = len(exact) - distinct.size
                grams[mode][0].append(distinct)
                grams[mode][1].append(np.full(distinct.size, index, dtype=np.int32))
        tables = {
            mode: _Table.build(
                np.concatenate(hs) if hs else np.empty(0, dtype=np.uint64),
                np.concatenate(its) if its else np.empty(0, dtype=np.int32),
            )
            for mode, (hs, its) in grams.items()
        }
        digest = json_digest(
            {
                "format": INDEX_FORMAT,
                "policy": policy_payload(policy),
                "unicode": unicodedata.unidata_version,
                "items": [
                    [i, sha256_digest(t.encode("utf-8"))] for i, t in zip(ids, texts, strict=True)
                ],
            }
        )
        unchecked = tuple(i for i, m in zip(ids, modes, strict=True) if m == 0)
        return cls(policy, ids, tuple(texts), modes, sizes, deficits, tables, digest, unchecked)

    def __len__(self) -> int:
        """Registered items, including :attr:`unchecked` ones."""
        return len(self._ids)

    @property
    def digest(self) -> str:
        """sha256 over policy, Unicode version and (id, normalised text digest) of every item.

        Texts enter only as digests, so the digest can go into task keys and logs without
        copying benchmark content (seed 000: keep the reference set's access boundary).
        """
        return self._digest

    @property
    def unchecked(self) -> tuple[str, ...]:
        """Items too short for any n-gram of this policy: this method cannot match them."""
        return self._unchecked

    @property
    def nbytes(self) -> int:
        """Approximate memory of the screening structures plus the normalised item texts."""
        tables = sum(t.nbytes for t in self._tables.values())
        return tables + sum(len(t) for t in self._texts) + 64 * len(self._ids)

    def mode(self, item_id: str) -> str:
        """``"word"``, ``"char"`` or ``"unchecked"``: how this item is matched."""
        index = bisect.bisect_left(self._ids, item_id)
        if index == len(self._ids) or self._ids[index] != item_id:
            raise KeyError(item_id)
        return ("unchecked", "word", "char")[int(self._modes[index])]

    def match(self, text: str) -> Match | None:
        """The best match at or above the threshold (ties: smallest item id), confirmed exactly."""
        return self.match_many([text])[0]

    def match_many(self, texts: Sequence[str]) -> list[Match | None]:
        """:meth:`match` for each text, batched so short records do not pay numpy call overhead."""
        results: list[Match | None] = []
        for lo, hi in _batches(texts):
            results.extend(self._match_batch(texts[lo:hi]))
        return results

    def _match_batch(self, texts: Sequence[str]) -> list[Match | None]:
        results: list[Match | None] = [None] * len(texts)
        if not self._ids:
            return results
        if len(texts) == 1 and len(texts[0]) < _SINGLE_CHARS:
            stream = _Stream.single(texts[0])
        else:
            stream = _normalise_stream(texts)
        policy = self.policy
        best: dict[int, tuple[int, int]] = {}  # record -> (-ppm, item index)
        for mode, table in self._tables.items():
            if not table.keys.size:
                continue
            h, spans = stream.windows(mode, _size(mode, policy))
            windows, keys = table.probe(h)
            if not windows.size:
                continue
            start, end = spans(windows)
            ok, rec = stream.valid(start, end)
            if not ok.any():
                continue
            start, end, rec, keys = start[ok], end[ok], rec[ok], keys[ok]
            for r, item in self._candidates(table, rec, keys):
                ppm = self._confirm(stream, r, item, mode, start[rec == r], end[rec == r])
                if ppm >= policy.threshold_ppm:
                    key = (-ppm, item)
                    if r not in best or key < best[r]:
                        best[r] = key
        for r, (neg_ppm, item) in best.items():
            results[r] = Match(self._ids[item], -neg_ppm)
        return results

    def _candidates(
        self, table: _Table, rec: np.ndarray, keys: np.ndarray
    ) -> list[tuple[int, int]]:
        """(record, item) pairs whose hash-hit upper bound reaches the threshold."""
        nkeys = np.int64(table.keys.size)
        pairs = np.unique(rec.astype(np.int64) * nkeys + keys)
        rec_u, key_u = pairs // nkeys, pairs % nkeys
        lo, hi = table.ptr[key_u], table.ptr[key_u + 1]
        lengths = hi - lo
        total = int(lengths.sum())
        offsets = np.repeat(lo - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        items = table.post[offsets + np.arange(total)].astype(np.int64)
        nitems = np.int64(len(self._ids))
        combined, counts = np.unique(np.repeat(rec_u, lengths) * nitems + items, return_counts=True)
        rec_c, item_c = combined // nitems, combined % nitems
        bound = counts + self._deficits[item_c]
        enough = bound * PPM >= self.policy.threshold_ppm * self._sizes[item_c]
        return [(int(r), int(i)) for r, i in zip(rec_c[enough], item_c[enough], strict=True)]

    def _confirm(
        self, stream: _Stream, r: int, item: int, mode: str, start: np.ndarray, end: np.ndarray
    ) -> int:
        """Exact containment in ppm from the real n-gram strings.

        Only the record's windows whose hash hit the index are materialised: every record n-gram
        equal to an item n-gram has the item n-gram's hash, so none is missed.
        """
        text = stream.text(r)
        base = int(stream.off[r]) + 1
        spans = zip(start.tolist(), end.tolist(), strict=True)
        seen = {text[a - base : b - base] for a, b in spans}
        exact = _ngrams(self._texts[item], mode, self.policy)
        return len(exact & seen) * PPM // len(exact)


def _size(mode: str, policy: ContaminationPolicy) -> int:
    return policy.ngram_words if mode == "word" else policy.ngram_chars


def _ngrams(text: str, mode: str, policy: ContaminationPolicy) -> set[str]:
    if mode == "word":
        return word_ngrams(text, policy.ngram_words)
    return char_ngrams(text, policy.ngram_chars)


def _mode(text: str, policy: ContaminationPolicy) -> str | None:
    """The n-gram kind for a normalised item text; None when it is too short for either."""
    tokens = text.count(" ") + 1 if text else 0
    letters = len(text) - (tokens - 1 if tokens else 0)
    no_spaces = 2 * len(_NO_SPACE_SCRIPTS.findall(text)) >= letters > 0
    if tokens >= policy.ngram_words and not no_spaces:
        return "word"
    if len(text) >= policy.ngram_chars:
        return "char"
    return None


def _batches(texts: Sequence[str]) -> Iterable[tuple[int, int]]:
    """[lo, hi) ranges of about _BATCH_CHARS characters (a longer text is alone)."""
    lo, size = 0, 0
    for i, text in enumerate(texts):
        size += len(text) + 1
        if size >= _BATCH_CHARS:
            yield lo, i + 1
            lo, size = i + 1, 0
    if lo < len(texts):
        yield lo, len(texts)


def _normalise_stream(texts: Sequence[str]) -> _Stream:
    """:func:`normalise` for a batch, vectorised over code points.

    Each text gets a leading separator space (and the stream a trailing one), so every token
    has whitespace on both sides. A punctuation run is kept only with word characters on both
    sides (inside a token); a whitespace character is kept, as one space, only right before a
    token's first kept character.
    """
    parts = [unicodedata.normalize("NFC", t).casefold() for t in texts]
    codes = _code_points(" " + " ".join(parts) + " ")
    classes = _classes()[codes]
    word = classes == _WORD
    keep = word.copy()
    keep[:-1] |= (classes[:-1] == _SPACE) & word[1:]
    punct = np.flatnonzero(classes == _PUNCT)
    if punct.size:
        breaks = np.flatnonzero(np.diff(punct) != 1)
        first = punct[np.concatenate(([0], breaks + 1))]
        last = punct[np.append(breaks, punct.size - 1)]
        before, after = classes[first - 1], classes[last + 1]
        inner = (before == _WORD) & (after == _WORD)
        if inner.any():
            keep[punct[np.repeat(inner, last - first + 1)]] = True
        keep[first[(before == _SPACE) & (after == _WORD)] - 1] = True
    starts = np.cumsum([0] + [len(p) + 1 for p in parts[:-1]], dtype=np.int64)
    counts = np.add.reduceat(keep, starts, dtype=np.int64) if parts else _EMPTY
    off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    out = codes[keep]
    out[classes[keep] == _SPACE] = 32
    return _Stream.of(out, off)


def _code_points(text: str) -> np.ndarray:
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


_POWERS: list[tuple[np.ndarray, np.ndarray]] = []


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(BASE**t, BASE**-t) mod 2**64 for t < at least n; grown by doubling, shared."""
    if _POWERS and _POWERS[0][0].size >= n:
        return _POWERS[0]
    size = max(1 << 16, 1 << max(0, n - 1).bit_length())
    forward = np.empty(size, dtype=np.uint64)
    inverse = np.empty(size, dtype=np.uint64)
    forward[0] = inverse[0] = 1
    forward[1:] = _BASE
    inverse[1:] = pow(_BASE, -1, 1 << 64)
    np.cumprod(forward, out=forward)
    np.cumprod(inverse, out=inverse)
    _POWERS[:] = [(forward, inverse)]
    return forward, inverse


@functools.cache
def _classes() -> np.ndarray:
    """Code point -> word / space (``str.isspace``) / punctuation (category ``P*``)."""
    table = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if ch.isspace():
            table[code] = _SPACE
        elif unicodedata.category(ch)[0] == "P":
            table[code] = _PUNCT
    table.flags.writeable = False
    return table


@functools.cache
def _punctuation() -> str:
    return "".join(chr(c) for c in np.flatnonzero(_classes() == _PUNCT).tolist())
