"""The ``attack`` group of ``corpus-assets selftest --faults``: a hostile or careless user's
moves against a built home (issue 31), each expected to be refused with nothing verified lost and
the digests of existing snapshots unchanged.

Cases are named ``attack.<point>-<what>`` (``--only '^attack\\.'`` runs the group); one module
per trust promise registers its cases:

- ``store``: gc expires an old generation before deleting, never what is served (point 5); a
  tokenizer whose vocabulary spells a ref builds and validates (point 6).
"""

from corpus_assets.selftest.attack import store  # noqa: F401
