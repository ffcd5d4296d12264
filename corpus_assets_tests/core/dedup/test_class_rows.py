"""A class's rows read from the order partitions' files answer as the same rows held."""

from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.dedup import class_rows
from corpus_assets.core.dedup.class_rows import FiledClass, HeldClass, KnownRanks, OrderSlice


def _filed(tmp_path: Path, rng: np.random.Generator) -> tuple[FiledClass, np.ndarray]:
    """A class of 700 rows (of 1,000) spread over three partitions, each of which also holds
    rows of other classes before and after the class's slice; the class's rows in order."""
    rows = rng.permutation(1000).astype(np.int32)
    mine, others = rows[:700], rows[700:]
    cuts, other_cuts = [0, 250, 251, 700], [0, 100, 200, 300]
    slices = []
    for p in range(3):
        ahead, behind = np.array_split(others[other_cuts[p] : other_cuts[p + 1]], 2)
        part = np.concatenate([ahead, mine[cuts[p] : cuts[p + 1]], behind])
        FiledClass.write(tmp_path / f"p{p}", part)
        slices.append(OrderSlice(str(tmp_path / f"p{p}"), len(ahead), len(part) - len(behind)))
    return FiledClass(tuple(slices), "int32"), mine


def test_a_filed_class_answers_as_its_rows_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(class_rows, "PIECE", 64)  # pieces cross the slices' ends
    rng = np.random.default_rng(5)
    filed, mine = _filed(tmp_path, rng)
    held = HeldClass(mine)
    ranks = rng.integers(0, len(mine), 300)  # any ranks, repeated, unsorted
    for order in (filed, held):
        assert order.n == len(mine)
        assert order.rows().tolist() == mine.tolist()
        assert np.concatenate(list(order.pieces())).tolist() == mine.tolist()
        assert order[ranks].tolist() == mine[ranks].tolist()
    rank_of = np.full(1000, -1)
    rank_of[mine] = np.arange(len(mine))
    for lo, hi in ((0, 1000), (0, 0), (137, 512), (999, 1000)):
        rows, ranks_in = filed.ranks_within(lo, hi)
        want = np.flatnonzero(rank_of[lo:hi] >= 0) + lo
        assert rows.tolist() == want.tolist()  # the class's rows in the range, ascending
        assert ranks_in.tolist() == rank_of[want].tolist()
    with pytest.raises(IndexError):
        filed[np.array([len(mine)])]


def test_known_ranks_read_once_and_refuse_others(tmp_path: Path) -> None:
    filed, mine = _filed(tmp_path, np.random.default_rng(6))
    known = KnownRanks(filed, np.array([9, 3, 600, 3]))
    assert known[np.array([600, 3, 9, 9])].tolist() == mine[[600, 3, 9, 9]].tolist()
    with pytest.raises(KeyError, match="not read"):
        known[np.array([4])]
