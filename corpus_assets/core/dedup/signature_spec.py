"""What a MinHash signature is a function of, named and validated in one place.

Signatures are cached and compared across builds, so everything that determines one lives in a
versioned :class:`SignatureSpec` and is hashed into cache keys via :func:`spec_payload`: the
normalisation and shingling rule (:mod:`.shingling`), the shingle hash, and the permutation
family with its seed. Two versions exist; ``minhash.v2`` (:mod:`.minhash_v2`, hashing with
:mod:`.unit_hash`) is the default, ``minhash.v1`` (:mod:`.minhash_v1`) stays selectable with
``SignatureSpec(version="minhash.v1")``. Signatures of different versions are not comparable.

Both versions: component ``j`` of the signature is the minimum over the document's shingles
(duplicates do not matter); a document with no shingles (only the empty text) has every
component :data:`MAX_HASH` (``2**32 - 1``), datasketch's initial value.
"""

from dataclasses import dataclass

VERSION_V1 = "minhash.v1"
VERSION_V2 = "minhash.v2"
VERSIONS = (VERSION_V1, VERSION_V2)
VERSION = VERSION_V2  # the default
MAX_HASH = (1 << 32) - 1


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
    if spec.version == VERSION_V1:
        payload["hash"] = "sha1_le32"
        payload["fingerprint"] = "sha1_le64"
        payload["permutation"] = "datasketch_legacy_mersenne61_mask32"
    else:
        payload["hash"] = "fp64_hi32"
        payload["fingerprint"] = "fp64=fmix64(horner_r(unit_hash64)+m);unit=fmix64(poly_k+len*c)"
        payload["permutation"] = "datasketch_affine32_fmix32"
    return payload
