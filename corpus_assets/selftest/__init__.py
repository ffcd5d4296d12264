"""``corpus-assets selftest --faults``: the seeds' fault list injected end to end.

Each case builds a small real corpus through the ``build_snapshot`` job (the CLI's own
processes), injects one fault and reports what the seed expects against what happened,
whether any verified data was lost, and whether the digests equal an undisturbed build's.
"""
