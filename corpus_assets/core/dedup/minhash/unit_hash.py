"""MinHash shingle fingerprints: a polynomial unit hash combined per shingle, in numpy.

This is the v2 hash on its own because it is both the definition (the scalar reference
functions, which the tests and the docs follow) and the hot path (the vectorised functions,
which must agree with the reference bit for bit); :mod:`.engine` only permutes its output.

All arithmetic is on unsigned integers modulo ``2**64`` (``M``); ``^`` is xor.
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
- the fingerprint (for exact Jaccard) is ``fingerprint64`` itself; the Jaccard of two
  documents' fingerprint sets equals that of their shingle sets unless two of their shingles
  collide in 64 bits.

The polynomial unit hash is the part designed for speed: over a whole block of documents it is
one wrapping uint64 prefix sum of ``c_j * K**j`` (``P`` of a unit starting at ``s`` is the
difference of two prefix sums times ``K**-s``; ``K`` is odd so the inverse exists mod ``M``),
and the shingle combination is ``n - 1`` vectorised multiply-adds. Only fixed-width wrapping
integer arithmetic on explicitly little-endian code points is used, so the values do not depend
on the platform. The polynomial is linear and ``K`` is public, so units can be crafted to
collide; that is an accepted risk for near-duplicate detection (it needs no secrecy).
"""

from collections.abc import Iterable, Iterator

import numpy as np

_M64 = (1 << 64) - 1
_POLY_BASE = 0x9E3779B97F4A7C15  # K
_POLY_BASE_INV = pow(_POLY_BASE, -1, 1 << 64)
_LEN_MULT = 0xC2B2AE3D27D4EB4F  # C
_COMBINE_MULT = 0x27D4EB2F165667C5  # R
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)


# --- scalar reference ------------------------------------------------------------------------


def _fmix64_int(x: int) -> int:
    """MurmurHash3 64-bit finaliser on a Python int (the scalar twin of :func:`_fmix64`)."""
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


# --- vectorised ------------------------------------------------------------------------------


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


def codepoints(text: str) -> np.ndarray:
    """The text's code points as little-endian uint32 (lone surrogates included, not refused)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _finish_units(poly: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``fmix64(P + L * C)`` (``poly`` is updated in place)."""
    poly += lengths * _u64(_LEN_MULT)
    return _fmix64(poly)


def char_units(cp: np.ndarray) -> np.ndarray:
    """Unit hashes of single code points: ``fmix64(c + C)``."""
    x = cp.astype(np.uint64)
    x += _u64(_LEN_MULT)
    return _fmix64(x)


def word_units(chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
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
        terms = prefix[1:]
        np.multiply(cp, pw[:size], out=terms)  # in place: no full-size temporary; wraps
        np.cumsum(terms, out=terms)
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


def shingle_fingerprints(units: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
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
