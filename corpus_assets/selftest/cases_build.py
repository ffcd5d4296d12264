"""Fault cases (to be filled in): see ``corpus_assets/selftest/__init__.py``."""
