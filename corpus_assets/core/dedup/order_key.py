"""The total order as one string per row, for the order sample sort's partitions, and the
near-dedup class names that lead it.

The runner's order merges (:mod:`.code_tasks`) cut their set at sampled values and sort by
value, so a row's place in the total order within its near class must be one value whose byte
order is the order's: (group, source rank, longer first, record id with nulls last). The rows
a value shares differ by (object, line, row) only, which a merge sorts after it.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
LONGER_FIRST_BIAS = 2**62  # longer-first keys are minus a length: biased to be non-negative


def order_key(
    group: pa.ChunkedArray | pa.Array,
    source_rank: np.ndarray,
    longer_first: np.ndarray,
    record_id: pa.ChunkedArray | pa.Array,
) -> pa.Array:
    """Each row's key: its group then NUL (below every character, so a group that prefixes
    another sorts first, as the names do), the integers in fixed-width hex, and the record id
    after a flag that puts a null after every id."""
    present = pc.binary_join_element_wise("0", pc.fill_null(record_id, ""), "")
    return pc.binary_join_element_wise(
        group,
        "\x00",
        _hex(np.asarray(source_rank).astype(np.uint64), 8),
        _hex((np.asarray(longer_first, dtype=np.int64) + LONGER_FIRST_BIAS).astype(np.uint64), 16),
        pc.if_else(pc.is_null(record_id), pa.scalar("1"), present),
        "",
    )


def _hex(values: np.ndarray, width: int) -> pa.Array:
    """Non-negative integers as ``width`` lower-case hex digits (byte order = numeric)."""
    digits = np.empty((len(values), width), np.uint8)
    for k in range(width):
        nibble = (values >> np.uint64(4 * k)) & np.uint64(15)
        digits[:, width - 1 - k] = _HEX[nibble.astype(np.intp)]
    return pa.array(digits.view(f"S{width}").ravel(), pa.binary()).cast(pa.string())


def class_names(table: pa.Table, content_of: dict[str, str]) -> pa.Array:
    """Each row's near-dedup class, named as the near stage names it (kind / its source's
    content); "" for every row without the sources' contents (no near stage)."""
    if not content_of:
        return pa.array(np.full(table.num_rows, ""), pa.string())
    kinds = pc.dictionary_encode(table["kind"].combine_chunks(), null_encoding="encode")
    sources = pc.dictionary_encode(table["source_id"].combine_chunks(), null_encoding="encode")
    width = len(sources.dictionary)
    pair = kinds.indices.to_numpy(zero_copy_only=False).astype(np.int64) * width
    pair += sources.indices.to_numpy(zero_copy_only=False)
    kind_names, source_names = kinds.dictionary.to_pylist(), sources.dictionary.to_pylist()
    present, at = np.unique(pair, return_inverse=True)
    names = []
    for code in present.tolist():
        kind, source = divmod(code, width)
        names.append(class_name(kind_names[kind], source_names[source], content_of))
    return pa.array(names, pa.string()).take(pa.array(at))


def class_name(kind: str | None, source: str, content_of: dict[str, str]) -> str:
    """The near-dedup class of a record of ``kind`` from ``source``: kind / the source's
    content (the order key ends a class's name with NUL, so none may hold one)."""
    name = f"{kind}/{content_of[source]}"  # a source not listed: KeyError, as ever
    if "\x00" in name:
        raise ValueError(f"near-dedup class {name!r} holds a NUL character")
    return name
