"""Leakage groups: components over group codes and the edges between their rows.

A record's leakage group is the component of its group over group ids, exact clusters and
verified near edges, named by the smallest group code in it. The components are found among the
groups the edges touch only (numpy hook-and-jump, O(edges) a pass); an untouched group is its
own component.
"""

from collections.abc import Iterator

import numpy as np

from corpus_assets.core.dedup.order import code_dtype, sorted_hits


def leakage_rows(group_codes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, a row whose group has the smallest group code of its component over groups and
    the edges (a, b) (any row of a group names it: they share the group id). Built a slice of
    rows at a time: no row-sized temporary beside the group lookup and the result."""
    n = len(group_codes)
    first_row_of_group = np.empty(int(group_codes.max(initial=-1)) + 1, code_dtype(n))
    for lo in range(0, n, ROOT_SLICE):  # in row order: a group's last row names it, as before
        hi = min(lo + ROOT_SLICE, n)
        first_row_of_group[group_codes[lo:hi]] = np.arange(lo, hi, dtype=first_row_of_group.dtype)
    leakage = np.empty(n, dtype=first_row_of_group.dtype)
    for lo, roots in root_slices(group_codes, group_codes[a], group_codes[b]):
        leakage[lo : lo + len(roots)] = first_row_of_group[roots]
    return leakage


ROOT_SLICE = 1 << 16  # groups mapped to their roots at a time (bounds the int64 temporaries)


def edge_group_roots(groups: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element of ``groups``, the smallest group of its component over the edges (a, b)
    between groups (in ``groups``' dtype); see :func:`root_slices`."""
    roots = np.empty_like(groups)
    for lo, part in root_slices(groups, a, b):
        roots[lo : lo + len(part)] = part
    return roots


def root_slices(
    groups: np.ndarray, a: np.ndarray, b: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    """Each slice of ``groups`` (its start, ``ROOT_SLICE`` elements) mapped to the smallest
    group of each element's component over the edges (a, b) between groups: the components
    are found among the groups the edges touch only (O(edges) per pass, not O(groups)); an
    untouched group is its own. A slice at a time, so the lookups' temporaries stay a slice's."""
    touched = np.unique(np.concatenate([a, b]))  # ascending: a component's smallest index is
    local = components(len(touched), np.searchsorted(touched, a), np.searchsorted(touched, b))
    root_of_touched = touched[local]  # ... its smallest group
    for lo in range(0, len(groups), ROOT_SLICE):
        part = np.array(groups[lo : lo + ROOT_SLICE], copy=True)
        at, hit = sorted_hits(touched, part)
        part[hit] = root_of_touched[at[hit]]
        yield lo, part


def components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element of 0..n-1 the smallest element of its connected component over the edges
    (a, b): hook every edge's larger root under the smaller one, jump pointers, repeat."""
    label = np.arange(n, dtype=code_dtype(n))  # labels are element numbers
    while len(a):
        la, lb = label[a], label[b]
        low = np.minimum(la, lb)
        hooked = label.copy()
        np.minimum.at(hooked, la, low)
        np.minimum.at(hooked, lb, low)
        while not np.array_equal(jumped := hooked[hooked], hooked):
            hooked = jumped
        if np.array_equal(hooked, label):
            break
        label = hooked
    return label
