"""corpus_assets: immutable, verifiable LLM training dataset snapshots as Dagster assets.

Importing it first chooses allocators that hand freed memory back (``_allocators``): it must
happen before pyarrow loads, and every process of a build imports this package first.
"""

from corpus_assets._allocators import use_returning_allocators

use_returning_allocators()
