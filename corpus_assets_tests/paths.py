"""Where the tests find the repository, their vendored data and the shared corpora, wherever the
test module sits in the tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "corpus_assets_tests" / "data"
# the corpora shared beside the checkout (a clone elsewhere skips the tests that need them)
CORPORA = REPO.parent / "shared" / "corpora"
