"""The binomial's lower quantile in exact integer arithmetic.

``scipy.stats`` costs ~0.35 s to import, paid by every process that loads the held-out search
(the CLI's build, Dagster's run worker, the gate); one quantile needs only a sum of terms.
"""

from fractions import Fraction
from functools import cache
from math import comb


@cache
def lower_quantile(q: float, n: int, p: float) -> int:
    """The smallest ``k`` with ``P(X <= k) >= q`` for ``X ~ Binomial(n, p)``: scipy's
    ``binom.ppf(q, n, p)``, computed exactly. With ``p = a/b`` and ``q = c/d`` (floats are exact
    binary fractions) the test is ``d * sum_{i<=k} C(n,i) a^i (b-a)^(n-i) >= c * b^n``."""
    a, b = Fraction(p).as_integer_ratio()
    c, d = Fraction(q).as_integer_ratio()
    bound, total = c * b**n, 0
    for k in range(n + 1):
        total += comb(n, k) * a**k * (b - a) ** (n - k)
        if d * total >= bound:
            return k
    return n
