"""The splits layer: each leakage component in one of train/validation/test: the family's front.

Other packages import from here only. :mod:`.build` is the layer (parent, tables, counts),
:mod:`.schema` the names, reasons and move/conflict rows, :mod:`.assign` inheritance and
hashing, :mod:`.by_time` the time boundary, :mod:`.conflicts` and :mod:`.bridges` conflict
resolution, :mod:`.residual` the rule that no path joins two splits, :mod:`.heldout` the
held-out members searched again for near pairs dedup missed (also run by the validation gate)
with :mod:`.heldout_state`, :mod:`.heldout_tasks`, :mod:`.heldout_narrowed` (the gate's
search bounded to changed records) and :mod:`.heldout_resolve`, and
:mod:`.report` what the layer reports.
"""

from corpus_assets.core.training_view.splits.assign import split_of
from corpus_assets.core.training_view.splits.build import CODE, SPLIT_COLUMNS, build_splits
from corpus_assets.core.training_view.splits.heldout import HeldoutScan, reuse
from corpus_assets.core.training_view.splits.heldout_narrowed import narrowed_pairs
from corpus_assets.core.training_view.splits.heldout_rows import row_order, searched_records
from corpus_assets.core.training_view.splits.schema import EXCLUDED, SPLITS, TRAIN, UNLINKED

__all__ = [
    "CODE",
    "EXCLUDED",
    "SPLITS",
    "SPLIT_COLUMNS",
    "TRAIN",
    "UNLINKED",
    "HeldoutScan",
    "build_splits",
    "narrowed_pairs",
    "reuse",
    "row_order",
    "searched_records",
    "split_of",
]
