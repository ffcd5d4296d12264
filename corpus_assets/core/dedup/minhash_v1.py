"""minhash.v1: sha1 shingle hashes and datasketch's legacy Mersenne-prime permutations.

Kept selectable (and bit-compatible with ``datasketch.MinHash(num_perm, seed,
scheme="legacy")``) so signatures cached by earlier builds stay comparable:

- shingle hash ``hv``: first 4 bytes of ``sha1(utf8(shingle))``, little-endian, as uint32;
- permutation ``j``: ``(a_j, b_j)`` drawn from ``np.random.RandomState(seed)`` in datasketch's
  order (``a = randint(1, 2**61 - 1)``, then ``b = randint(0, 2**61 - 1)``, per permutation);
- value: ``((a_j * hv + b_j) mod 2**64) mod (2**61 - 1)``, masked to the low 32 bits - the
  product wraps in uint64 exactly as datasketch's numpy arithmetic does;
- fingerprint (for exact Jaccard): first 8 bytes of ``sha1``, little-endian, as uint64.

Texts go in blocks of about ``_BLOCK_CODEPOINTS`` code points and the permutations in blocks of
``_BLOCK_CELLS`` values, so temporaries stay bounded for any batch (both are tuning only: the
results do not depend on them). v1 needs texts that encode as UTF-8 (a lone surrogate raises).
"""

import hashlib
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

from corpus_assets.core.dedup.jaccard import EMPTY_FP, sorted_unique
from corpus_assets.core.dedup.shingling import shingles
from corpus_assets.core.dedup.signature_spec import MAX_HASH, SignatureSpec

MERSENNE_PRIME = (1 << 61) - 1

# Several rows x num_perm uint64 temporaries per permutation block: kept cache-sized.
_BLOCK_CELLS = 1 << 15
# Text code points per block of documents.
_BLOCK_CODEPOINTS = 1 << 18

_SHA1_PREFIX = np.dtype([("fp", "<u8"), ("rest", "V12")])


@lru_cache(maxsize=16)
def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` uint64 rows, drawn exactly as datasketch's ``_init_permutations`` (legacy)."""
    gen = np.random.RandomState(seed)
    pairs = [
        (
            gen.randint(1, MERSENNE_PRIME, dtype=np.uint64),
            gen.randint(0, MERSENNE_PRIME, dtype=np.uint64),
        )
        for _ in range(num_perm)
    ]
    ab = np.array(pairs, dtype=np.uint64).T.copy()
    ab.setflags(write=False)
    return ab[0], ab[1]


def _sha1_prefixes(all_shingles: list[bytes]) -> np.ndarray:
    """First 8 bytes of each shingle's sha1, little-endian, as uint64."""
    sha1 = hashlib.sha1
    digests = b"".join([sha1(s).digest() for s in all_shingles])
    return np.frombuffer(digests, dtype=_SHA1_PREFIX)["fp"].astype(np.uint64)


def _permute(hv: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``((a * hv + b) mod 2**64 mod (2**61 - 1)) & (2**32 - 1)`` as uint32, rows = shingles.

    The mod-Mersenne step uses ``x = q * 2**61 + r  =>  x = q + r (mod 2**61 - 1)`` with
    ``q <= 7``, then one conditional subtraction: bit-identical to ``%``, without division.
    """
    x = hv[:, None] * a[None, :]  # wraps mod 2**64, as in datasketch
    x += b
    y = x >> np.uint64(61)
    x &= np.uint64(MERSENNE_PRIME)
    x += y
    np.minimum(x, x - np.uint64(MERSENNE_PRIME), out=x)  # x - p wraps above x when x < p
    return x.astype(np.uint32)  # the low 32 bits == & MAX_HASH


def _legacy_min_into(
    out: np.ndarray, hv: np.ndarray, counts: np.ndarray, spec: SignatureSpec
) -> None:
    """Min of the v1 permutations of ``hv`` (documents' runs of ``counts`` rows) into ``out``."""
    a, b = _permutations(spec.num_perm, spec.seed)
    if not len(hv):
        return
    ids = np.flatnonzero(counts)  # documents with shingles; their runs are contiguous, in order
    starts = (np.cumsum(counts) - counts)[ids]
    total = len(hv)
    block = max(1, _BLOCK_CELLS // spec.num_perm)
    for s in range(0, total, block):
        e = min(s + block, total)
        i0 = int(np.searchsorted(starts, s, side="right")) - 1  # document holding row s
        i1 = int(np.searchsorted(starts, e, side="left"))  # documents starting before e
        idx = starts[i0:i1] - s
        idx[0] = 0
        mins = np.minimum.reduceat(_permute(hv[s:e], a, b), idx, axis=0)
        rows = ids[i0:i1]
        np.minimum(out[rows], mins, out=mins)
        out[rows] = mins


def _text_blocks(texts: Sequence[str]) -> Iterator[range]:
    """Consecutive index ranges of about ``_BLOCK_CODEPOINTS`` code points of text each."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        size += len(text) + 1
        if size >= _BLOCK_CODEPOINTS:
            yield range(start, i + 1)
            start, size = i + 1, 0
    if start < len(texts):
        yield range(start, len(texts))


def sketch_v1(
    texts: Sequence[str], spec: SignatureSpec, want_sig: bool, want_fp: bool
) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """``(signatures or None, fingerprints or [])`` of the texts under a v1 ``spec``."""
    sig = np.full((len(texts), spec.num_perm), MAX_HASH, dtype=np.uint32) if want_sig else None
    fps: list[np.ndarray] = [EMPTY_FP] * len(texts) if want_fp else []
    for block in _text_blocks(texts):
        docs = [shingles(texts[i], spec) for i in block]
        flat = [s for sh in docs for s in sh]
        if not flat:
            continue
        prefix = _sha1_prefixes(flat)
        counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        if sig is not None:
            view = sig[block.start : block.stop]
            _legacy_min_into(view, prefix & np.uint64(MAX_HASH), counts, spec)
        if want_fp:
            ends = np.cumsum(counts).tolist()
            for i, s, e in zip(block, [0, *ends[:-1]], ends, strict=True):
                if e > s:
                    fps[i] = sorted_unique(prefix[s:e])
    return sig, fps
