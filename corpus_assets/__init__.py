"""corpus_assets: immutable, verifiable LLM training dataset snapshots as Dagster assets.

Importing it first chooses allocators that hand freed memory back (``_allocators``): it must
happen before pyarrow loads, and every process of a build imports this package first. It also
makes young-generation garbage collections rarer (``_gc``), which start-up pays for most.
"""

from corpus_assets._allocators import use_returning_allocators
from corpus_assets._gc import use_rarer_young_collections

use_returning_allocators()
use_rarer_young_collections()
