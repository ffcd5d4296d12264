"""MinHash signatures and shingle fingerprints for near-duplicate detection (banding and
clustering live in :mod:`corpus_assets.core.dedup.near_dedup`).

A signature is fully determined by a versioned :class:`SignatureSpec`: the normalisation and
shingling rule, the shingle hash, and the permutation family with its seed. Two versions exist;
``minhash.v2`` is the default, ``minhash.v1`` stays selectable with
``SignatureSpec(version="minhash.v1")``. Signatures of different versions are not comparable.

Shingling (both versions; :func:`shingles`, :func:`shingle_units`)
------------------------------------------------------------------
The text is normalised: NFC, casefold, every run of whitespace (``str.split()``) collapsed to
one space, ends trimmed (then NFC again if casefolding denormalised it). Texts written mostly in
unspaced scripts (Han, kana, Thai, Lao, Khmer, Myanmar, Tibetan characters are at least a third
of those plus all other letters) are *char mode*: the units are the code points of the
normalised text (spaces included) and ``n = shingle_chars``. Every other text is *word mode*:
the units are the space-separated tokens of the normalised text (``norm.split(" ")``) and
``n = shingle_words``. A shingle is ``n`` consecutive units; a text with fewer than ``n`` units
yields one shingle of all its units (so a short document still has a non-empty set); the empty
(or all-whitespace) text yields none. Shingles are a set: duplicates are dropped, first
occurrence order kept. As text a shingle is its units joined by ``" "`` (word mode) or by
``""`` (char mode), i.e. a substring of the normalised text.

minhash.v1 (bit-compatible with ``datasketch.MinHash(num_perm, seed, scheme="legacy")``)
--------------------------------------------------------------------------------------------
- shingle hash ``hv``: first 4 bytes of ``sha1(utf8(shingle))``, little-endian, as uint32;
- permutation ``j``: ``(a_j, b_j)`` drawn from ``np.random.RandomState(seed)`` in datasketch's
  order (``a = randint(1, 2**61 - 1)``, then ``b = randint(0, 2**61 - 1)``, per permutation);
- value: ``((a_j * hv + b_j) mod 2**64) mod (2**61 - 1)``, masked to the low 32 bits - the
  product wraps in uint64 exactly as datasketch's numpy arithmetic does;
- fingerprint (for exact Jaccard, :func:`fingerprints`): first 8 bytes of ``sha1``,
  little-endian, as uint64.

minhash.v2 (bit-compatible with ``datasketch.MinHash(num_perm, seed, scheme="affine32",
hashfunc=lambda units: fingerprint64_units(units) >> 32)`` updated with :func:`shingle_units`)
--------------------------------------------------------------------------------------------
All arithmetic is on unsigned integers modulo ``2**64`` (``M``) or ``2**32``; ``^`` is xor.
Constants: ``K = 0x9E3779B97F4A7C15``, ``C = 0xC2B2AE3D27D4EB4F``, ``R = 0x27D4EB2F165667C5``.

- ``fmix64(x)``: MurmurHash3's 64-bit finaliser: ``x ^= x >> 33; x = x * 0xFF51AFD7ED558CCD;
  x ^= x >> 33; x = x * 0xC4CEB9FE1A85EC53; x ^= x >> 33`` (mod ``M``).
- unit hash of a unit with code points ``c_0 .. c_{L-1}`` (``ord`` of each character; a lone
  surrogate counts as its code point): ``P = sum_i c_i * K**i mod M`` and
  ``unit_hash64 = fmix64((P + L * C) mod M)``. A char-mode unit is one code point ``c``:
  ``fmix64((c + C) mod M)``.
- fingerprint of a shingle of ``m`` units with unit hashes ``u_0 .. u_{m-1}`` (``m = n``, or
  fewer for a short document): ``acc = sum_k u_k * R**(m-1-k) mod M`` (Horner: ``acc = 0;
  acc = acc * R + u_k``) and ``fingerprint64 = fmix64((acc + m) mod M)``
  (:func:`fingerprint64_units`; :func:`fingerprint64` takes the shingle text and its mode).
- ``hv = fingerprint64 >> 32`` (the upper 32 bits), then datasketch's ``affine32`` scheme:
  ``h = fmix32(hv)`` (MurmurHash3's 32-bit finaliser: ``h ^= h >> 16; h *= 0x85EBCA6B;
  h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16`` mod ``2**32``) and permutation ``j`` gives
  ``a_j * h + b_j mod 2**32`` with ``gen = np.random.RandomState(seed)``,
  ``a = gen.randint(0, 2**31, num_perm, dtype=uint32) * 2 + 1``, then
  ``b = gen.randint(0, 2**32, num_perm, dtype=uint32)``;
- fingerprint (for exact Jaccard): ``fingerprint64`` itself; the Jaccard of two documents'
  fingerprint sets equals that of their shingle sets unless two of their shingles collide
  in 64 bits.

The polynomial unit hash is the part designed for speed: over a whole block of documents it is
one wrapping uint64 prefix sum of ``c_j * K**j`` (``P`` of a unit starting at ``s`` is the
difference of two prefix sums times ``K**-s``; ``K`` is odd so the inverse exists mod ``M``),
and the shingle combination is ``n - 1`` vectorised multiply-adds. Only fixed-width wrapping
integer arithmetic on explicitly little-endian code points is used, so the values do not depend
on the platform. The polynomial is linear and ``K`` is public, so units can be crafted to
collide; that is an accepted risk for near-duplicate detection (it needs no secrecy).

Both versions: component ``j`` of the signature is the minimum over the document's shingles
(duplicates do not matter); a document with no shingles (only the empty text) has every
component ``2**32 - 1``, datasketch's initial value. :func:`fingerprints` gives each
document's sorted unique uint64 fingerprints; :func:`jaccard_sorted` compares two of them.

Texts are processed in blocks of about ``_BLOCK_CODEPOINTS`` normalised code points and the
permutations in blocks of ``_BLOCK_CELLS`` (v1) / ``_AFFINE_BLOCK_CELLS`` (v2) values, so
temporaries stay bounded for any batch. A longer document is streamed in pieces of that many
code points, its units overlapping by ``n - 1``; what still grows with it is a few copies of
its normalised text and, for :func:`fingerprints`, its own result. v1 needs texts that encode
as UTF-8 (a lone surrogate raises); v2 hashes any ``str``.
"""

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

VERSION_V1 = "minhash.v1"
VERSION_V2 = "minhash.v2"
VERSIONS = (VERSION_V1, VERSION_V2)
VERSION = VERSION_V2  # the default
MERSENNE_PRIME = (1 << 61) - 1
MAX_HASH = (1 << 32) - 1

# Permutation values per vectorised block: v1 has several rows x num_perm uint64 temporaries
# (kept cache-sized); v2 one num_perm x rows uint32 slab (4 MB), long rows for numpy's loops.
_BLOCK_CELLS = 1 << 15
_AFFINE_BLOCK_CELLS = 1 << 20
# Normalised code points per block of texts (v2 temporaries are ~40 bytes per code point).
_BLOCK_CODEPOINTS = 1 << 18

_M64 = (1 << 64) - 1
_POLY_BASE = 0x9E3779B97F4A7C15  # K
_POLY_BASE_INV = pow(_POLY_BASE, -1, 1 << 64)
_LEN_MULT = 0xC2B2AE3D27D4EB4F  # C
_COMBINE_MULT = 0x27D4EB2F165667C5  # R
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
_FMIX32 = (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)

_UNSPACED = re.compile(
    "[\u0e00-\u0e7f\u0e80-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff"
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
_LETTER = re.compile(r"[^\W\d_]")
# Every character with str.isspace(), mapped to " ": longer texts than _SPLIT_MAX collapse
# whitespace with it, the same result as " ".join(text.split()).
_SPACES = dict.fromkeys(
    [
        *range(0x09, 0x0E),
        *range(0x1C, 0x21),
        *(0x85, 0xA0, 0x1680),
        *range(0x2000, 0x200B),
        *(0x2028, 0x2029, 0x202F, 0x205F, 0x3000),
    ],
    " ",
)
_SPLIT_MAX = 1 << 16
_EMPTY_FP = np.zeros(0, dtype=np.uint64)
_EMPTY_FP.setflags(write=False)


@dataclass(frozen=True)
class SignatureSpec:
    """Versioned signature definition: shingling + hash + permutation family + seed."""

    version: str = VERSION
    num_perm: int = 128
    seed: int = 1
    shingle_words: int = 5
    shingle_chars: int = 5

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"unsupported signature version {self.version!r}")
        for name in ("num_perm", "shingle_words", "shingle_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")


def spec_payload(spec: SignatureSpec) -> dict:
    """Everything that determines a signature, as ints and strings (for hashing into keys)."""
    payload = {
        "version": spec.version,
        "num_perm": spec.num_perm,
        "seed": spec.seed,
        "shingle_words": spec.shingle_words,
        "shingle_chars": spec.shingle_chars,
        "normalisation": "nfc+casefold+collapse_ws",
        "shingling": "words|chars(unspaced_letters*3>=letters)|whole_if_short",
    }
    if spec.version == VERSION_V1:
        payload["hash"] = "sha1_le32"
        payload["fingerprint"] = "sha1_le64"
        payload["permutation"] = "datasketch_legacy_mersenne61_mask32"
    else:
        payload["hash"] = "fp64_hi32"
        payload["fingerprint"] = "fp64=fmix64(horner_r(unit_hash64)+m);unit=fmix64(poly_k+len*c)"
        payload["permutation"] = "datasketch_affine32_fmix32"
    return payload


# --- shingling (both versions) -------------------------------------------------------------


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFC", text).casefold()
    if len(text) <= _SPLIT_MAX:
        text = " ".join(text.split())
    else:  # the same without a list of every token (and so in a few copies' memory)
        text = text.translate(_SPACES)
        while "  " in text:
            text = text.replace("  ", " ")
        text = text.strip(" ")
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", text)  # casefolding can decompose


def _unspaced(norm: str) -> bool:
    if norm.isascii():
        return False
    found = _UNSPACED.findall(norm)
    if not found:
        return False
    # Characters of the unspaced blocks (letters and their vowel-sign marks) vs other letters.
    other = len(_LETTER.findall(norm)) - sum(c.isalpha() for c in found)
    return len(found) * 3 >= len(found) + other


def _units(text: str, spec: SignatureSpec) -> tuple[Sequence[str], int, bool]:
    """``(units, n, unspaced)`` of the normalised text."""
    norm = _normalise(text)
    if not norm:
        return [], spec.shingle_words, False
    if _unspaced(norm):
        return norm, spec.shingle_chars, True
    return norm.split(" "), spec.shingle_words, False


def shingle_units(text: str, spec: SignatureSpec = SignatureSpec()) -> list[tuple[str, ...]]:
    """The document's shingle set as tuples of units (first-occurrence order); see module doc."""
    units, n, _ = _units(text, spec)
    if not units:
        return []
    if len(units) < n:
        return [tuple(units)]
    return list(dict.fromkeys(tuple(units[i : i + n]) for i in range(len(units) - n + 1)))


def shingles(text: str, spec: SignatureSpec = SignatureSpec()) -> list[bytes]:
    """The document's shingle set (UTF-8 bytes, first-occurrence order); see module docstring."""
    norm = _normalise(text)
    if not norm:
        return []
    if _unspaced(norm):
        n = spec.shingle_chars
        if len(norm) < n:
            return [norm.encode()]
        grams = [norm[i : i + n] for i in range(len(norm) - n + 1)]
    else:
        tokens = norm.split(" ")
        n = spec.shingle_words
        if len(tokens) < n:
            return [norm.encode()]
        if n == 1:
            grams = tokens
        else:
            grams = [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return [g.encode() for g in dict.fromkeys(grams)]


# --- minhash.v2 scalar reference -------------------------------------------------------------


def _fmix64_int(x: int) -> int:
    shift, m1, m2 = _FMIX64
    x ^= x >> shift
    x = (x * m1) & _M64
    x ^= x >> shift
    x = (x * m2) & _M64
    return x ^ (x >> shift)


def unit_hash64(unit: str) -> int:
    """v2 hash of one unit (a token, or one code point in char mode); scalar reference."""
    poly, power = 0, 1
    for ch in unit:
        poly = (poly + ord(ch) * power) & _M64
        power = (power * _POLY_BASE) & _M64
    return _fmix64_int((poly + len(unit) * _LEN_MULT) & _M64)


def fingerprint64_units(units: Iterable[str]) -> int:
    """v2 fingerprint of a shingle given as its units; scalar reference of the vectorised path."""
    acc, m = 0, 0
    for unit in units:
        acc = (acc * _COMBINE_MULT + unit_hash64(unit)) & _M64
        m += 1
    return _fmix64_int((acc + m) & _M64)


def fingerprint64(shingle: str, unspaced: bool = False) -> int:
    """v2 fingerprint of a shingle's text: units are its code points if ``unspaced`` (char
    mode), else its ``" "``-separated tokens (word mode)."""
    return fingerprint64_units(shingle if unspaced else shingle.split(" "))


# --- minhash.v1 --------------------------------------------------------------------------


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


_SHA1_PREFIX = np.dtype([("fp", "<u8"), ("rest", "V12")])


def _sha1_prefixes(all_shingles: list[bytes]) -> np.ndarray:
    """First 8 bytes of each shingle's sha1, little-endian, as uint64."""
    sha1 = hashlib.sha1
    digests = b"".join([sha1(s).digest() for s in all_shingles])
    return np.frombuffer(digests, dtype=_SHA1_PREFIX)["fp"].astype(np.uint64)


def _hash32(all_shingles: list[bytes]) -> np.ndarray:
    """sha1 of each shingle, first 4 bytes little-endian, as uint64 (``sha1_hash32``)."""
    return _sha1_prefixes(all_shingles) & np.uint64(MAX_HASH)


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


def _legacy_min_into(out: np.ndarray, hv: np.ndarray, counts: np.ndarray, spec) -> None:
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


def _signatures_of_shingles(docs: Sequence[list[bytes]], spec: SignatureSpec) -> np.ndarray:
    """v1 signatures of already shingled documents (all in one block)."""
    out = np.full((len(docs), spec.num_perm), MAX_HASH, dtype=np.uint32)
    flat = [s for sh in docs for s in sh]
    counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    if flat:
        _legacy_min_into(out, _hash32(flat), counts, spec)
    return out


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    x = np.sort(x)
    if len(x) > 1:
        keep = np.empty(len(x), dtype=bool)
        keep[0] = True
        np.not_equal(x[1:], x[:-1], out=keep[1:])
        x = x[keep]
    return x


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


def _v1_run(texts: Sequence[str], spec: SignatureSpec, want_sig: bool, want_fp: bool):
    sig = np.full((len(texts), spec.num_perm), MAX_HASH, dtype=np.uint32) if want_sig else None
    fps: list[np.ndarray] = [_EMPTY_FP] * len(texts) if want_fp else []
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
                    fps[i] = _sorted_unique(prefix[s:e])
    return sig, fps


# --- minhash.v2 vectorised -----------------------------------------------------------------


def _u64(value: int) -> np.uint64:
    return np.uint64(value)


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3 64-bit finaliser, in place on a uint64 array (wrapping)."""
    shift, m1, m2 = _u64(_FMIX64[0]), _u64(_FMIX64[1]), _u64(_FMIX64[2])
    x ^= x >> shift
    x *= m1
    x ^= x >> shift
    x *= m2
    x ^= x >> shift
    return x


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


_POW_TABLES: list[np.ndarray] = [np.ones(1, np.uint64), np.ones(1, np.uint64)]


def _pow_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(K**i, K**-i)`` mod ``2**64`` for ``i < size`` (cached; at most a block's worth)."""
    pw, ipw = _POW_TABLES
    if len(pw) < size:
        grown = -(-size // 4096) * 4096
        pw = np.full(grown, _POLY_BASE, dtype=np.uint64)
        ipw = np.full(grown, _POLY_BASE_INV, dtype=np.uint64)
        pw[0] = ipw[0] = 1
        np.multiply.accumulate(pw, out=pw)  # wraps mod 2**64
        np.multiply.accumulate(ipw, out=ipw)
        _POW_TABLES[:] = [pw, ipw]
    return pw[:size], ipw[:size]


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _finish_units(poly: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``fmix64(P + L * C)`` (``poly`` is updated in place)."""
    poly += lengths * _u64(_LEN_MULT)
    return _fmix64(poly)


def _char_units(cp: np.ndarray) -> np.ndarray:
    """Unit hashes of single code points: ``fmix64(c + C)``."""
    x = cp.astype(np.uint64)
    x += _u64(_LEN_MULT)
    return _fmix64(x)


def _word_units(chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """Unit hashes of the ``" "``-separated tokens of a code-point stream given in chunks.

    A token cut by a chunk boundary is carried over as its partial ``(P, L)``:
    ``P(x + y) = P(x) + K**len(x) * P(y)``. Yields one array per chunk, the last token last.
    """
    carry_poly, carry_len = 0, 0
    for cp in chunks:
        size = len(cp)
        if not size:
            continue
        spaces = np.flatnonzero(cp == 32)
        starts = np.empty(len(spaces) + 1, dtype=np.intp)
        starts[0] = 0
        np.add(spaces, 1, out=starts[1:])
        ends = np.empty_like(starts)
        ends[:-1] = spaces
        ends[-1] = size
        pw, ipw = _pow_tables(size + 1)  # a segment can start at size (chunk ends in " ")
        prefix = np.empty(size + 1, dtype=np.uint64)
        prefix[0] = 0
        np.cumsum(cp * pw[:size], out=prefix[1:])  # wraps mod 2**64
        poly = prefix[ends]
        poly -= prefix[starts]
        poly *= ipw[starts]  # P of each segment, relative to its own start
        lengths = (ends - starts).astype(np.uint64)
        head_poly = (carry_poly + pow(_POLY_BASE, carry_len, 1 << 64) * int(poly[0])) & _M64
        head_len = carry_len + int(lengths[0])
        if not len(spaces):
            carry_poly, carry_len = head_poly, head_len
            continue
        poly[0], lengths[0] = head_poly, head_len
        carry_poly, carry_len = int(poly[-1]), int(lengths[-1])
        yield _finish_units(poly[:-1], lengths[:-1])
    yield _finish_units(
        np.array([carry_poly], dtype=np.uint64), np.array([carry_len], dtype=np.uint64)
    )


def _shingle_fingerprints(units: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """Fingerprints of every shingle (duplicates kept), documents in order.

    ``units`` holds the unit hashes of documents laid end to end, ``counts[d] >= 1`` of them for
    document ``d``, which has ``max(counts[d] - n + 1, 1)`` shingles.
    """
    first = np.cumsum(counts) - counts
    n_sh = np.maximum(counts - n + 1, 1)
    offsets = np.cumsum(n_sh) - n_sh
    # Start unit of every shingle: first[d] + j for the j-th shingle of document d.
    src = np.arange(int(n_sh.sum()), dtype=np.int64)
    src -= np.repeat(offsets - first, n_sh)
    short = np.flatnonzero(counts < n)  # one shingle of counts[d] < n units
    out = np.empty(len(src), dtype=np.uint64)
    mult = _u64(_COMBINE_MULT)
    window = units  # window[t]: Horner combination of units[t : t + k]
    for k in range(1, n + 1):
        if k > 1:
            window = window[:-1] * mult  # wraps mod 2**64
            window += units[k - 1 :]
        if k < n and len(short):
            docs = short[counts[short] == k]
            out[offsets[docs]] = window[first[docs]] + _u64(k)
    if len(short):
        full = np.repeat(counts >= n, n_sh)
        out[full] = window[src[full]] + _u64(n)
    else:
        np.add(window[src], _u64(n), out=out)
    return _fmix64(out)


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


class _V2Sink:
    """Turns unit hashes of documents into signature rows and fingerprint arrays."""

    def __init__(self, count: int, spec: SignatureSpec, want_sig: bool, want_fp: bool) -> None:
        self.sig = np.full((count, spec.num_perm), MAX_HASH, np.uint32) if want_sig else None
        self.fps: list[np.ndarray] = [_EMPTY_FP] * count if want_fp else []
        self.want_fp = want_fp
        self.a, self.b = _affine32_permutations(spec.num_perm, spec.seed)

    def add(
        self, rows: list[int], units: np.ndarray, counts: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        fp = _shingle_fingerprints(units, counts, n)
        n_sh = np.maximum(counts - n + 1, 1)
        if self.sig is not None:
            h = (fp >> _u64(32)).astype(np.uint32)
            _affine_min_into(self.sig, np.asarray(rows), _fmix32(h), n_sh, self.a, self.b)
        return fp, n_sh

    def add_documents(self, rows: list[int], norms: list[str], unspaced: bool, n: int) -> None:
        """Complete normalised documents of one mode, laid end to end in one pass."""
        if unspaced:
            units = _char_units(_codepoints("".join(norms)))
            counts = np.fromiter(map(len, norms), dtype=np.int64, count=len(norms))
        else:
            units = np.concatenate(list(_word_units([_codepoints(" ".join(norms))])))
            counts = np.array([norm.count(" ") + 1 for norm in norms], dtype=np.int64)
        fp, n_sh = self.add(rows, units, counts, n)
        if self.want_fp:
            ends = np.cumsum(n_sh).tolist()
            for row, s, e in zip(rows, [0, *ends[:-1]], ends, strict=True):
                self.fps[row] = _sorted_unique(fp[s:e])

    def add_long_document(self, row: int, norm: str, unspaced: bool, n: int, piece: int) -> None:
        """One document streamed in pieces of about ``piece`` units overlapping by ``n - 1``."""
        cps = (_codepoints(norm[j : j + piece]) for j in range(0, len(norm), piece))
        stream = map(_char_units, cps) if unspaced else _word_units(cps)
        parts: list[np.ndarray] = []
        pending = _EMPTY_FP
        emitted = False
        for units in stream:
            pending = np.concatenate([pending, units])
            if len(pending) >= max(piece, n):
                fp = self.add([row], pending, np.array([len(pending)]), n)[0]
                parts += [_sorted_unique(fp)] if self.want_fp else []
                pending, emitted = pending[len(pending) - n + 1 :].copy(), True
        if not emitted or len(pending) >= n:  # else the tail's windows were all seen
            fp = self.add([row], pending, np.array([len(pending)]), n)[0]
            parts += [_sorted_unique(fp)] if self.want_fp else []
        if self.want_fp:
            self.fps[row] = _sorted_unique(np.concatenate(parts))


def _v2_run(texts: Sequence[str], spec: SignatureSpec, want_sig: bool, want_fp: bool):
    sink = _V2Sink(len(texts), spec, want_sig, want_fp)
    limit = _BLOCK_CODEPOINTS
    pending: dict[bool, tuple[list[int], list[str]]] = {False: ([], []), True: ([], [])}
    size = 0

    def flush() -> None:
        for unspaced, (rows, norms) in pending.items():
            if rows:
                n = spec.shingle_chars if unspaced else spec.shingle_words
                sink.add_documents(rows, norms, unspaced, n)
                rows.clear()
                norms.clear()

    for i, text in enumerate(texts):
        norm = _normalise(text)
        if not norm:
            continue
        unspaced = _unspaced(norm)
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


# --- public API ----------------------------------------------------------------------------


def _run(texts: Sequence[str], spec: SignatureSpec, want_sig: bool, want_fp: bool):
    run = _v1_run if spec.version == VERSION_V1 else _v2_run
    return run(texts, spec, want_sig, want_fp)


def signatures(texts: Sequence[str], spec: SignatureSpec = SignatureSpec()) -> np.ndarray:
    """MinHash signatures, shape ``(len(texts), num_perm)``, dtype uint32 (see module doc)."""
    return _run(texts, spec, True, False)[0]


def fingerprints(texts: Sequence[str], spec: SignatureSpec = SignatureSpec()) -> list[np.ndarray]:
    """Per document its sorted unique uint64 shingle fingerprints (empty text: empty array)."""
    return _run(texts, spec, False, True)[1]


def sketch(
    texts: Sequence[str], spec: SignatureSpec = SignatureSpec()
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(signatures(texts, spec), fingerprints(texts, spec))`` in one pass."""
    return _run(texts, spec, True, True)


def jaccard_sorted(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique uint64 arrays (e.g. :func:`fingerprints` rows).

    Two empty arrays are 1.0 by convention (identical, no 0/0); one empty array gives 0.0.
    """
    na, nb = len(a), len(b)
    if not na or not nb:
        return 1.0 if na == nb else 0.0
    if na > nb:
        a, b, na, nb = b, a, nb, na
    idx = np.searchsorted(b, a)  # the smaller array looked up in the larger one
    np.minimum(idx, nb - 1, out=idx)
    inter = int(np.count_nonzero(b[idx] == a))
    return inter / (na + nb - inter)


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity; two empty sets are 1.0 by convention (identical, no 0/0)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
