"""Which Jaccard removes a record: a threshold per script class (shingle mode), from v3 on.

From ``minhash.v3`` on a pair of unspaced-script texts (class ``char``: Han, kana, Thai, ...,
shingled as ICU words) needs ``char``, a pair of spaced texts (``word``) the policy's
``threshold``. By default both are the same: on Debian's translated man pages
(``bench/parallel_manpages.py --calibrate``) segmented word shingles at the word threshold give
the English pages' verdicts best, and any higher ``char`` lost more true near duplicates
than it saved. ``char_threshold`` in the policy overrides it; v1/v2 have one threshold.
"""

from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from corpus_assets.core.dedup.minhash import VERSION_V3

WORD, CHAR = "word", "char"  # script class names in reports


@dataclass(frozen=True)
class ScriptThresholds:
    """The Jaccard a pair needs, by shingle mode."""

    word: Decimal
    char: Decimal

    @classmethod
    def for_version(
        cls, version: str, threshold: Decimal, char_threshold: Decimal | None = None
    ) -> "ScriptThresholds":
        """v3: ``char_threshold``, by default ``threshold`` (the calibrated choice); v1/v2:
        ``threshold`` for both modes."""
        if version != VERSION_V3 or char_threshold is None:
            return cls(threshold, threshold)
        return cls(threshold, char_threshold)

    def by_rank(self, char_mode: np.ndarray) -> np.ndarray:
        """The threshold of each record (float64), from its char-mode flags."""
        return np.where(char_mode, float(self.char), float(self.word))
