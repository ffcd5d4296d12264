"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home (issue 31), each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``audit`` (point 8, audit trail): a newline in ``approve --by``, a tombstone reason, a
  permit's run id or purpose is refused naming the field; ``history`` shows no forged row; a
  ``password: ...``, ``API_KEY=...`` or ``user:password@host`` source line is redacted.
"""

from corpus_assets.selftest.attack import audit  # noqa: F401
