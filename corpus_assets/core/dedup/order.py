"""The stated total order of dedup and the integer coding it runs on.

Every "earlier record" in dedup is earlier in this order, never in completion order: source
priority (config order - where a user ranks sources by governance and trust), longer text first
(the fuller copy wins), record id, object, line. Sorting happens in Arrow, so memory is a few
machine words per record.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def codes(column: pa.ChunkedArray | pa.Array, ordered: bool = False) -> tuple[np.ndarray, pa.Array]:
    """Integer code per row and the distinct values; with ``ordered`` the codes follow the
    values' string order, so the smallest code is the smallest value."""
    values = pc.unique(column)
    if ordered:
        values = values.take(pc.array_sort_indices(values))
    coded = pc.index_in(column, value_set=values)
    return np.asarray(coded.to_numpy(zero_copy_only=False), dtype=np.int64), values


def total_order(records: pa.Table, source_order: dict[str, int]) -> np.ndarray:
    """Row indices in the stated total order (see the module docstring)."""
    ranked = pa.array(sorted(source_order, key=source_order.__getitem__), pa.string())
    if "length" in records.column_names:
        length = records.column("length")
    else:
        length = pc.utf8_length(records.column("text"))
    keys = pa.table(
        {
            "source": pc.index_in(records.column("source_id"), value_set=ranked),
            "length": pc.negate(pc.cast(length, pa.int64())),
            "record_id": records.column("record_id"),
            "object": records.column("object"),
            "line": records.column("line"),
        }
    )
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in keys.column_names])
    return order.to_numpy().astype(np.int64)


def first_in_order(codes_in_order: np.ndarray) -> np.ndarray:
    """Mask of positions holding the first occurrence of their code (sort based, stable)."""
    by_code = np.argsort(codes_in_order, kind="stable")
    sorted_codes = codes_in_order[by_code]
    first = np.zeros(len(codes_in_order), dtype=bool)
    if not len(first):
        return first
    first[by_code[np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]]] = True
    return first
