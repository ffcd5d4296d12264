"""``python -m corpus_assets.cli``: the console script (``main.run``)."""

from corpus_assets.cli.main import run

run()
