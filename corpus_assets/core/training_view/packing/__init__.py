"""The packed_blocks layer: the mixed samples' cached tokens packed into verified block shards.

The family's front: other packages import from here only. :mod:`.build` is the layer,
:mod:`.samples` maps a sample to its token cache row (:mod:`.locate`: that lookup as a
partitioned join), :mod:`.plan` plans blocks on token counts alone, :mod:`.incremental` keeps a
parent's blocks, :mod:`.blocks` builds block arrays a batch at a time, :mod:`.shards` writes a
shard per job on the task runner and :mod:`.checks` holds the block invariants.
"""

from corpus_assets.core.training_view.packing.build import (
    CODE,
    SPAN_COLUMNS,
    PackingError,
    build_packed_blocks,
)
from corpus_assets.core.training_view.packing.incremental import memo_part

__all__ = ["CODE", "SPAN_COLUMNS", "PackingError", "build_packed_blocks", "memo_part"]
