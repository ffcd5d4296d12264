"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home (issue 31), each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``signatures``: points 1-2, every reader checks the DSSE signature against a trust root
  outside the data home (re-signed, unsigned, home key pair replaced, private key mode).
"""

from corpus_assets.selftest.attack import signatures  # noqa: F401
