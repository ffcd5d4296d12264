"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home (issue 31), each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``leakage`` (point 7): a near pair dedup's LSH missed, hashed to two splits, ends in one.
"""

from corpus_assets.selftest.attack import leakage  # noqa: F401
