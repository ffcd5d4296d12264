"""MinHash signatures for near-duplicate detection (signature part only; no LSH banding yet).

A signature is fully determined by a versioned :class:`SignatureSpec`: the normalisation and
shingling rule, the shingle hash, and the permutation family with its seed. ``minhash.v1`` is
bit-compatible with ``datasketch.MinHash(num_perm, seed)`` (legacy scheme, default
``sha1_hash32``) updated with the same shingles, so signatures can be checked against it:

- shingle hash ``hv``: first 4 bytes of ``sha1(shingle)``, little-endian, as uint32;
- permutation ``j``: ``(a_j, b_j)`` drawn from ``np.random.RandomState(seed)`` in datasketch's
  order (``a = randint(1, 2**61 - 1)``, then ``b = randint(0, 2**61 - 1)``, per permutation);
- value: ``((a_j * hv + b_j) mod 2**64) mod (2**61 - 1)``, masked to the low 32 bits - the
  product wraps in uint64 exactly as datasketch's numpy arithmetic does;
- component ``j`` of the signature is the minimum over the document's shingles; a document
  with no shingles (only the empty text) has every component ``2**32 - 1``, datasketch's
  initial value.

Shingling (:func:`shingles`): the text is normalised (NFC, casefold, whitespace runs collapsed
to one space, ends trimmed). Texts written mostly in unspaced scripts (Han, kana, Thai, Lao,
Khmer, Myanmar, Tibetan characters are at least a third of those plus all other letters) get
character n-grams of ``shingle_chars``; every other text gets word n-grams of
``shingle_words`` space-separated tokens. A text with fewer tokens than ``n`` yields one
shingle, the whole normalised text, so a short document still has a non-empty set; the empty
(or all-whitespace) text yields none.
Shingles are a set: duplicates are dropped, first occurrence order kept.
"""

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

VERSION = "minhash.v1"
MERSENNE_PRIME = (1 << 61) - 1
MAX_HASH = (1 << 32) - 1

# Shingle rows per vectorised block: rows x num_perm uint64 temporaries stay cache-sized.
_BLOCK_CELLS = 1 << 15

_UNSPACED = re.compile(
    "[\u0e00-\u0e7f\u0e80-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff"
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class SignatureSpec:
    """Versioned signature definition: shingling + hash + permutation family + seed."""

    version: str = VERSION
    num_perm: int = 128
    seed: int = 1
    shingle_words: int = 5
    shingle_chars: int = 5

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise ValueError(f"unsupported signature version {self.version!r}")
        for name in ("num_perm", "shingle_words", "shingle_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")


def spec_payload(spec: SignatureSpec) -> dict:
    """Everything that determines a signature, as ints and strings (for hashing into keys)."""
    return {
        "version": spec.version,
        "num_perm": spec.num_perm,
        "seed": spec.seed,
        "shingle_words": spec.shingle_words,
        "shingle_chars": spec.shingle_chars,
        "normalisation": "nfc+casefold+collapse_ws",
        "shingling": "words|chars(unspaced_letters*3>=letters)|whole_if_short",
        "hash": "sha1_le32",
        "permutation": "datasketch_legacy_mersenne61_mask32",
    }


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFC", text).casefold()
    text = " ".join(text.split())
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


def _hash32(all_shingles: list[bytes]) -> np.ndarray:
    """sha1 of each shingle, first 4 bytes little-endian, as uint64 (``sha1_hash32``)."""
    sha1 = hashlib.sha1
    digests = b"".join([sha1(s).digest() for s in all_shingles])
    return np.frombuffer(digests, dtype="<u4").reshape(-1, 5)[:, 0].astype(np.uint64)


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


def signatures(texts: Sequence[str], spec: SignatureSpec = SignatureSpec()) -> np.ndarray:
    """MinHash signatures, shape ``(len(texts), num_perm)``, dtype uint32 (see module doc)."""
    return _signatures_of_shingles([shingles(text, spec) for text in texts], spec)


def _signatures_of_shingles(docs: Sequence[list[bytes]], spec: SignatureSpec) -> np.ndarray:
    a, b = _permutations(spec.num_perm, spec.seed)
    out = np.full((len(docs), spec.num_perm), MAX_HASH, dtype=np.uint32)
    flat = [s for sh in docs for s in sh]
    counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    if not flat:
        return out
    hv = _hash32(flat)
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
    return out


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity; two empty sets are 1.0 by convention (identical, no 0/0)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
