"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home (issue 31), each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``errors`` (point 8, first half): one-line errors before a partition is added, a secret in an
  ``s3://`` URL masked, Ctrl-C during a build.
"""

from corpus_assets.selftest.attack import errors  # noqa: F401
