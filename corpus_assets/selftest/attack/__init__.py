"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home, each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``accounting`` (point 4, first half): a repeated record id with another text is quarantined as
  ``id.conflict`` and counted; a members row dropped and re-signed is refused by ``counts_add_up``.
- ``audit`` (point 8, audit trail): a newline in ``approve --by``, a tombstone reason, a
  permit's run id or purpose is refused naming the field; ``history`` shows no forged row; a
  ``password: ...``, ``API_KEY=...`` or ``user:password@host`` source line is redacted.
- ``errors`` (point 8, first half): one-line errors before a partition is added, a secret in an
  ``s3://`` URL masked, Ctrl-C during a build.
- ``leakage`` (point 7): a near pair dedup's LSH missed, hashed to two splits, ends in one.
- ``signatures``: points 1-2, every reader checks the DSSE signature against a trust root
  outside the data home (re-signed, unsigned, home key pair replaced, private key mode).
- ``sources``: points 3 and 4b, a source folder linking to the home's private key, an object
  deleted between the freeze's listing and its copy.
- ``store``: gc expires an old generation before deleting, never what is served (point 5); a
  tokenizer whose vocabulary spells a ref builds and validates (point 6).
"""

from corpus_assets.selftest.attack import (
    accounting,  # noqa: F401
    audit,  # noqa: F401
    errors,  # noqa: F401
    leakage,  # noqa: F401
    signatures,  # noqa: F401
    sources,  # noqa: F401
    store,  # noqa: F401
)
