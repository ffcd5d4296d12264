"""The exact binomial quantile equals scipy's on the held-out search's whole parameter range."""

import pytest
from scipy.stats import binom

from corpus_assets.core.dedup.binomial import lower_quantile


@pytest.mark.parametrize("num_perm", [16, 64, 128, 256])
def test_lower_quantile_is_scipys_binom_ppf(num_perm: int) -> None:
    """Every threshold 0.01..0.99 and tail from 1e-12 to the median (golden values: scipy)."""
    for step in range(1, 100):
        p = step / 100
        for q in (1e-12, 1e-9, 1e-6, 0.05, 0.5):
            assert lower_quantile(q, num_perm, p) == int(binom.ppf(q, num_perm, p)), (q, p)
