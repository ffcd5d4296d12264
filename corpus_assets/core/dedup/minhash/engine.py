"""The MinHash scheme of ``minhash.v2`` and ``v3``: :mod:`.unit_hash` fingerprints, ``affine32``.

Bit-compatible with ``datasketch.MinHash(num_perm, seed, scheme="affine32", hashfunc=lambda
units: fingerprint64_units(units) >> 32)`` updated with ``shingling.shingle_units``, but computed
over whole blocks of documents at once (that is what makes it the default):

- ``hv = fingerprint64 >> 32`` (the upper 32 bits), then ``h = fmix32(hv)`` (MurmurHash3's
  32-bit finaliser: ``h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35;
  h ^= h >> 16`` mod ``2**32``) and permutation ``j`` gives ``a_j * h + b_j mod 2**32`` with
  ``gen = np.random.RandomState(seed)``,
  ``a = gen.randint(0, 2**31, num_perm, dtype=uint32) * 2 + 1``, then
  ``b = gen.randint(0, 2**32, num_perm, dtype=uint32)``.

Texts are processed in blocks of about ``_BLOCK_CODEPOINTS`` normalised code points and the
permutations in blocks of ``_AFFINE_BLOCK_CELLS`` values, so temporaries stay bounded for any
batch (both are tuning only: the results do not depend on them). A longer document is streamed
in pieces of that many code points, its units overlapping by ``n - 1``; what still grows with
it is a few copies of its normalised text and, for fingerprints, its own result. v2 hashes any
``str`` (lone surrogates included).
"""

from collections.abc import Sequence
from functools import lru_cache
from itertools import repeat

import numpy as np

from corpus_assets.core.dedup.jaccard import EMPTY_FP, sorted_unique
from corpus_assets.core.dedup.minhash.segment import segment_words
from corpus_assets.core.dedup.minhash.shingling import is_unspaced, normalise
from corpus_assets.core.dedup.minhash.spec import MAX_HASH, SignatureSpec, segments_unspaced
from corpus_assets.core.dedup.minhash.unit_hash import (
    char_units,
    codepoints,
    shingle_fingerprints,
    word_units,
)

# One num_perm x rows uint32 slab (4 MB) per permutation block: long rows for numpy's loops.
_AFFINE_BLOCK_CELLS = 1 << 20
# Normalised code points per block of texts (temporaries are ~40 bytes per code point).
_BLOCK_CODEPOINTS = 1 << 18
_FMIX32 = (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)


def _fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3 32-bit finaliser, in place on a uint32 array (datasketch's ``_fmix(., 32)``)."""
    s1, m1, s2, m2, s3 = (np.uint32(v) for v in _FMIX32)
    x ^= x >> s1
    x *= m1
    x ^= x >> s2
    x *= m2
    x ^= x >> s3
    return x


@lru_cache(maxsize=16)
def _affine32_permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` uint32 vectors drawn exactly as datasketch's ``_init_permutations`` (affine32)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


def _affine_min_into(
    out: np.ndarray, rows: np.ndarray, h: np.ndarray, n_sh: np.ndarray, a: np.ndarray, b: np.ndarray
) -> None:
    """``out[rows[d]] = min(out[rows[d]], min over d's run of a * h + b)``, uint32 wrapping.

    Document ``d`` owns the next ``n_sh[d] >= 1`` values of ``h``; ``rows`` are distinct.
    Computed as ``(num_perm, block)`` slabs, reduced per document along the contiguous axis.
    """
    num_perm = len(a)
    block = max(1, _AFFINE_BLOCK_CELLS // num_perm)
    starts = np.cumsum(n_sh) - n_sh
    total = len(h)
    buf = np.empty(num_perm * min(block, total), dtype=np.uint32)
    a_col, b_col = a[:, None], b[:, None]
    for s in range(0, total, block):
        e = min(s + block, total)
        i0 = int(np.searchsorted(starts, s, side="right")) - 1  # document holding value s
        i1 = int(np.searchsorted(starts, e, side="left"))  # documents starting before e
        idx = starts[i0:i1] - s
        idx[0] = 0
        x = buf[: num_perm * (e - s)].reshape(num_perm, e - s)
        np.multiply(a_col, h[s:e], out=x)  # wraps mod 2**32
        x += b_col
        mins = np.minimum.reduceat(x, idx, axis=1).T
        r = rows[i0:i1]
        out[r] = np.minimum(out[r], mins)


class _Sink:
    """Turns unit hashes of documents into signature rows and fingerprint arrays."""

    def __init__(self, count: int, spec: SignatureSpec, want_sig: bool, want_fp: bool) -> None:
        self.sig = np.full((count, spec.num_perm), MAX_HASH, np.uint32) if want_sig else None
        self.fps: list[np.ndarray] = [EMPTY_FP] * count if want_fp else []
        self.want_fp = want_fp
        self.a, self.b = _affine32_permutations(spec.num_perm, spec.seed)

    def add(
        self, rows: list[int], units: np.ndarray, counts: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Fold documents' unit hashes into their signature rows; ``(fingerprints, n_sh)``."""
        fp = shingle_fingerprints(units, counts, n)
        n_sh = np.maximum(counts - n + 1, 1)
        if self.sig is not None:
            h = (fp >> np.uint64(32)).astype(np.uint32)
            _affine_min_into(self.sig, np.asarray(rows), _fmix32(h), n_sh, self.a, self.b)
        return fp, n_sh

    def add_documents(self, rows: list[int], norms: list[str], unspaced: bool, n: int) -> None:
        """Complete normalised documents of one mode, laid end to end in one pass."""
        if unspaced:
            units = char_units(codepoints("".join(norms)))
            counts = np.fromiter(map(len, norms), dtype=np.int64, count=len(norms))
        else:
            units = np.concatenate(list(word_units([codepoints(" ".join(norms))])))
            counts = np.fromiter(map(str.count, norms, repeat(" ")), np.int64, len(norms)) + 1
        fp, n_sh = self.add(rows, units, counts, n)
        if self.want_fp:
            ends = np.cumsum(n_sh).tolist()
            for row, s, e in zip(rows, [0, *ends[:-1]], ends, strict=True):
                self.fps[row] = sorted_unique(fp[s:e])

    def add_long_document(self, row: int, norm: str, unspaced: bool, n: int, piece: int) -> None:
        """One document streamed in pieces of about ``piece`` units overlapping by ``n - 1``."""
        cps = (codepoints(norm[j : j + piece]) for j in range(0, len(norm), piece))
        stream = map(char_units, cps) if unspaced else word_units(cps)
        parts: list[np.ndarray] = []
        pending = EMPTY_FP
        emitted = False
        for units in stream:
            pending = np.concatenate([pending, units])
            if len(pending) >= max(piece, n):
                fp = self.add([row], pending, np.array([len(pending)]), n)[0]
                parts += [sorted_unique(fp)] if self.want_fp else []
                pending, emitted = pending[len(pending) - n + 1 :].copy(), True
        if not emitted or len(pending) >= n:  # else the tail's windows were all seen
            fp = self.add([row], pending, np.array([len(pending)]), n)[0]
            parts += [sorted_unique(fp)] if self.want_fp else []
        if self.want_fp:
            self.fps[row] = sorted_unique(np.concatenate(parts))


def sketch_texts(
    texts: Sequence[str],
    spec: SignatureSpec,
    want_sig: bool,
    want_fp: bool,
    modes: np.ndarray | None = None,
) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """``(signatures or None, fingerprints or [])`` of the texts under a v2/v3 ``spec``;
    ``modes``, if given, receives each text's char-mode flag (the empty text: word mode)."""
    sink = _Sink(len(texts), spec, want_sig, want_fp)
    limit = _BLOCK_CODEPOINTS
    pending: dict[bool, tuple[list[int], list[str]]] = {False: ([], []), True: ([], [])}
    size = 0
    segmented = segments_unspaced(spec)

    def flush() -> None:
        for unspaced, (rows, norms) in pending.items():
            if rows:
                n = spec.shingle_chars if unspaced else spec.shingle_words
                sink.add_documents(rows, norms, unspaced, n)
                rows.clear()
                norms.clear()

    for i, text in enumerate(texts):
        norm = normalise(text)
        if not norm:
            continue
        unspaced = is_unspaced(norm)
        if modes is not None:
            modes[i] = unspaced
        if unspaced and segmented:  # v3: ICU words, shingled as word mode
            norm, unspaced = segment_words(norm), False
        if len(norm) > limit:
            n = spec.shingle_chars if unspaced else spec.shingle_words
            sink.add_long_document(i, norm, unspaced, n, limit)
            continue
        if size + len(norm) > limit:
            flush()
            size = 0
        rows, norms = pending[unspaced]
        rows.append(i)
        norms.append(norm)
        size += len(norm) + 1
    flush()
    return sink.sig, sink.fps
