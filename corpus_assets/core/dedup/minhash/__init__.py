"""MinHash signatures and shingle fingerprints for near-duplicate detection: the family's front.

Callers ask for signatures (banding and clustering live in
:mod:`corpus_assets.core.dedup.near_dedup`) and fingerprints (exact Jaccard,
:mod:`corpus_assets.core.dedup.jaccard`) of a batch of texts; the :class:`~.spec.SignatureSpec`
version picks the scheme, so callers never depend on which one runs. Other packages import from
here only. The pieces:

- :mod:`.spec`: the versioned spec, what a signature is a function of;
- :mod:`.shingling`: normalisation and shingles (:mod:`.segment`: ICU words of unspaced
  scripts, ``minhash.v3``);
- :mod:`.unit_hash`: the shingle fingerprint (scalar reference and vectorised);
- :mod:`.engine`: the permutations (datasketch's affine32) over blocks of documents.

:func:`fingerprints` gives each document's sorted unique uint64 fingerprints;
:func:`~corpus_assets.core.dedup.jaccard.jaccard_sorted` compares two of them. Texts are
processed in bounded blocks, so memory does not grow with the batch.
"""

from collections.abc import Sequence

import numpy as np

from corpus_assets.core.dedup.minhash.engine import sketch_texts
from corpus_assets.core.dedup.minhash.shingling import is_unspaced, normalise, shingles
from corpus_assets.core.dedup.minhash.spec import (
    DEFAULT_SPEC,
    VERSION_V2,
    VERSION_V3,
    SignatureSpec,
    spec_payload,
    stores_modes,
)

__all__ = [
    "VERSION_V2",
    "VERSION_V3",
    "SignatureSpec",
    "fingerprints",
    "is_unspaced",
    "normalise",
    "shingles",
    "signatures",
    "signatures_and_modes",
    "sketch",
    "spec_payload",
    "stores_modes",
]


def signatures(texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC) -> np.ndarray:
    """MinHash signatures, shape ``(len(texts), num_perm)``, dtype uint32 (see module doc)."""
    return sketch_texts(texts, spec, True, False)[0]


def signatures_and_modes(
    texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC
) -> tuple[np.ndarray, np.ndarray]:
    """``(signatures(texts, spec), char-mode flag per text as bool)`` in one pass."""
    modes = np.zeros(len(texts), dtype=bool)
    return sketch_texts(texts, spec, True, False, modes)[0], modes


def fingerprints(texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC) -> list[np.ndarray]:
    """Per document its sorted unique uint64 shingle fingerprints (empty text: empty array)."""
    return sketch_texts(texts, spec, False, True)[1]


def sketch(
    texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(signatures(texts, spec), fingerprints(texts, spec))`` in one pass."""
    return sketch_texts(texts, spec, True, True)
