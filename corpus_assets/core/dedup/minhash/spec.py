"""What a MinHash signature is a function of, named and validated in one place.

Signatures are cached and compared across builds, so everything that determines one lives in a
versioned :class:`SignatureSpec` and is hashed into cache keys via :func:`spec_payload`: the
normalisation and shingling rule (:mod:`.shingling`), the shingle hash, and the permutation
family with its seed. ``minhash.v3`` is the default: v2's hashing (:mod:`.engine`, with
:mod:`.unit_hash`), but a text in an unspaced script is cut into ICU words
(:mod:`.segment`) and shingled like spaced text instead of in 5-character shingles, so a pair
gets the verdict its translation into a spaced language gets; its signature files also store
each record's shingle mode, for the per-script report and threshold (:mod:`.near_rule`).
``minhash.v2`` (character shingles, the earlier default) stays selectable with
``SignatureSpec(version=...)``. Signatures of different versions are not comparable (v2 and v3
agree on spaced text).

Both versions: component ``j`` of the signature is the minimum over the document's shingles
(duplicates do not matter); a document with no shingles (only the empty text) has every
component :data:`MAX_HASH` (``2**32 - 1``), datasketch's initial value.
"""

from dataclasses import dataclass

from corpus_assets.core.dedup.minhash.segment import SEGMENTER
from corpus_assets.core.runtime.config import NearDedupPolicy

VERSION_V2 = "minhash.v2"
VERSION_V3 = "minhash.v3"  # v2's hashing; the shingle mode per record; a threshold per mode
VERSIONS = (VERSION_V2, VERSION_V3)
DEFAULT = NearDedupPolicy()  # the config's defaults are the spec's: one source, never two
VERSION = DEFAULT.signature  # the default
MAX_HASH = (1 << 32) - 1


@dataclass(frozen=True)
class SignatureSpec:
    """Versioned signature definition: shingling + hash + permutation family + seed."""

    version: str = VERSION
    num_perm: int = DEFAULT.num_perm
    seed: int = DEFAULT.seed
    shingle_words: int = DEFAULT.shingle_words
    shingle_chars: int = DEFAULT.shingle_chars

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"unsupported signature version {self.version!r}")
        for name in ("num_perm", "shingle_words", "shingle_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")


DEFAULT_SPEC = SignatureSpec()  # the default argument of the public functions


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
    payload["hash"] = "fp64_hi32"
    payload["fingerprint"] = "fp64=fmix64(horner_r(unit_hash64)+m);unit=fmix64(poly_k+len*c)"
    payload["permutation"] = "datasketch_affine32_fmix32"
    if spec.version == VERSION_V3:
        payload["shingling"] = f"words|{SEGMENTER}+words(unspaced_letters*3>=letters)"
        payload["modes"] = "row num_perm: 1 unspaced (segmented), 0 spaced"
    return payload


def stores_modes(spec: SignatureSpec) -> bool:
    """True when the cached signatures carry each record's shingle mode (v3 on)."""
    return spec.version == VERSION_V3


def segments_unspaced(spec: SignatureSpec) -> bool:
    """True when unspaced-script texts are cut into ICU words (v3 on), not characters."""
    return spec.version == VERSION_V3
