"""MinHash signatures and shingle fingerprints for near-duplicate detection: the entry points.

Callers ask for signatures (banding and clustering live in
:mod:`corpus_assets.core.dedup.near_dedup`) and fingerprints (exact Jaccard,
:mod:`.jaccard`) of a batch of texts; the :class:`~.signature_spec.SignatureSpec` version picks
the scheme, so callers never depend on which one runs. The pieces:

- :mod:`.signature_spec`: the versioned spec, what a signature is a function of;
- :mod:`.shingling`: normalisation and shingles, shared by both versions;
- :mod:`.minhash_v1`: sha1 hashes, datasketch's legacy permutations;
- :mod:`.unit_hash`: the v2 shingle fingerprint (scalar reference and vectorised);
- :mod:`.minhash_v2`: v2 permutations (datasketch's affine32) over blocks of documents;
- :mod:`.jaccard`: sorted unique fingerprint sets and their exact Jaccard.

:func:`fingerprints` gives each document's sorted unique uint64 fingerprints;
:func:`~.jaccard.jaccard_sorted` compares two of them. Both schemes process texts in bounded
blocks, so memory does not grow with the batch.
"""

from collections.abc import Sequence

import numpy as np

from corpus_assets.core.dedup.minhash_v1 import sketch_v1
from corpus_assets.core.dedup.minhash_v2 import sketch_v2
from corpus_assets.core.dedup.signature_spec import DEFAULT_SPEC, VERSION_V1, SignatureSpec


def _run(
    texts: Sequence[str], spec: SignatureSpec, want_sig: bool, want_fp: bool
) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """The scheme of ``spec.version``; signatures, fingerprints or both in one pass."""
    run = sketch_v1 if spec.version == VERSION_V1 else sketch_v2
    return run(texts, spec, want_sig, want_fp)


def signatures(texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC) -> np.ndarray:
    """MinHash signatures, shape ``(len(texts), num_perm)``, dtype uint32 (see module doc)."""
    return _run(texts, spec, True, False)[0]


def signatures_and_modes(
    texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC
) -> tuple[np.ndarray, np.ndarray]:
    """``(signatures(texts, spec), char-mode flag per text as bool)`` in one pass (v2/v3)."""
    if spec.version == VERSION_V1:
        raise ValueError("minhash.v1 signatures do not carry shingle modes")
    modes = np.zeros(len(texts), dtype=bool)
    return sketch_v2(texts, spec, True, False, modes)[0], modes


def fingerprints(texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC) -> list[np.ndarray]:
    """Per document its sorted unique uint64 shingle fingerprints (empty text: empty array)."""
    return _run(texts, spec, False, True)[1]


def sketch(
    texts: Sequence[str], spec: SignatureSpec = DEFAULT_SPEC
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(signatures(texts, spec), fingerprints(texts, spec))`` in one pass."""
    return _run(texts, spec, True, True)
