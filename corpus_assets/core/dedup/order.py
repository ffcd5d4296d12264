"""First occurrences in the stated total order of dedup.

Every "earlier record" in dedup is earlier in the total order, never in completion order: source
priority (config order - where a user ranks sources by governance and trust), longer text first
(the fuller copy wins), record id, object, line. The order itself is sorted on integers
(:meth:`~corpus_assets.core.dedup.partition_db.PartitionDb.total_order`: source rank, length,
the row's rank by record id); dedup then works on integer codes in that order, a few machine
words per record.
"""

from collections.abc import Mapping, Sequence

import numpy as np

# The clusters table's sort keys (the total order's last ones): each part, one per canonical
# chunk, is in this order, their concatenation is not, so a reader that needs it asks for it.
RECORD_ORDER = ("record_id", "object", "line")


def first_in_order(codes_in_order: np.ndarray) -> np.ndarray:
    """Mask of positions holding the first occurrence of their code (sort based, stable)."""
    by_code = np.argsort(codes_in_order, kind="stable")
    sorted_codes = codes_in_order[by_code]
    first = np.zeros(len(codes_in_order), dtype=bool)
    if not len(first):
        return first
    first[by_code[np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]]] = True
    return first


def source_ranks(source_order: Mapping[str, int], sources: Sequence[str | None]) -> np.ndarray:
    """Each of ``sources``' rank in the total order (config order; a source not listed, or
    none, after all of them), as int32."""
    last = max(source_order.values(), default=-1) + 1
    return np.array(
        [source_order.get(s, last) if s is not None else last for s in sources], np.int32
    )
