"""The band index: per near-dedup class, every band's records in bucket order, kept so that a
child snapshot bands only the records its parent's index lacks.

Banding sorts each band's keys of every class record, ties in total order (rank). The index
stores that order: per class one ``(bands, n)`` array of (key, partition row). A child whose
parent ran the same code and policy maps the parent's rows onto its own (chunks both list by
records digest), drops entries whose record left the class (gone, or no longer an exact
representative), computes the keys of only the class records the parent's index lacks (new
records, and old ones that became representatives) and inserts them in place. The arrays are
those a full sort gives, so candidate pairs, band figures and the child's own index are the
same bytes as a from-scratch build's. Survivors keep their relative order (the total order is
on the records' own fields); should a band show otherwise, the class is banded in full.
"""

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.near_dedup import (
    LshParams,
    SignatureBlock,
    band_keys,
    band_keys_of,
    sorted_band,
)

ENTRY = np.dtype([("key", "<u8"), ("row", "<u4")])  # one record of one band, in bucket order
MAX_ROWS = 1 << 32  # partition rows an entry's ``row`` can hold


class IndexWriter:
    """A class's index written a band at a time (an ``.npy`` of ``ENTRY``, shape (bands, n))."""

    def __init__(self, path: Path, bands: int, n: int) -> None:
        self.path, self.bands, self.n = path, bands, n
        self.written = 0
        self._file = open(path, "wb")  # noqa: SIM115 (closed by ``close``)
        header = {"descr": np.lib.format.dtype_to_descr(ENTRY), "fortran_order": False}
        np.lib.format.write_array_header_1_0(self._file, {**header, "shape": (bands, n)})

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """The next band: its keys in bucket order and the partition row of each."""
        self.add_parts([(keys, rows)])

    def add_parts(self, parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        """The next band from consecutive parts of it (keys in bucket order, the partition row
        of each), written as they come: the bytes of :meth:`add` with the parts joined."""
        if self.written >= self.bands:
            raise ValueError(f"{self.path.name}: a band past its {self.bands}")
        entries_written = 0
        for keys, rows in parts:
            if len(rows) and int(rows.max()) >= MAX_ROWS:
                raise ValueError(f"{self.path.name}: partition rows beyond {MAX_ROWS}")
            entries = np.empty(len(keys), dtype=ENTRY)
            entries["key"], entries["row"] = keys, rows
            entries.tofile(self._file)
            entries_written += len(keys)
        if entries_written != self.n:
            raise ValueError(f"band {self.written} of {self.path.name}: {entries_written} entries")
        self.written += 1

    def close(self) -> Path:
        """The finished file, fsynced (the store adopts it by hard link)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self.written != self.bands:
            raise ValueError(f"{self.path.name}: {self.written} of {self.bands} bands written")
        return self.path


@dataclass(frozen=True)
class ParentBands:
    """A parent's index of one class, read through the child's rows and ranks."""

    entries: np.ndarray  # (bands, parent n) of ENTRY, memory-mapped
    rank_of: np.ndarray  # parent row -> its child row's rank in this class (-1: not in it)

    @classmethod
    def open(cls, path: Path, parent_to_child: np.ndarray, rank_of: np.ndarray) -> "ParentBands":
        """``parent_to_child``: parent row -> child row (negative: gone); ``rank_of``: child
        row -> its rank in this class (-1: not in it). Composed once, so each band's ranks
        are one gather."""
        ranks = np.where(parent_to_child >= 0, rank_of[np.maximum(parent_to_child, 0)], -1)
        return cls(np.load(path, mmap_mode="r"), ranks)

    def ranks(self, band: int) -> np.ndarray:
        """Each parent entry's child rank in this class (-1 where it left the class)."""
        return self.rank_of[self.entries[band]["row"]]

    def missing(self, n: int) -> np.ndarray:
        """Ranks of the class records the parent's index lacks, ascending."""
        held = np.zeros(n, dtype=bool)
        ranks = self.ranks(0)
        held[ranks[ranks >= 0]] = True
        return np.flatnonzero(~held)

    def band(
        self, band: int, new_ranks: np.ndarray, new_keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The band's keys and ranks in bucket order, or None when survivors changed order."""
        ranks = self.ranks(band)
        kept = ranks >= 0
        keys, ranks = np.asarray(self.entries[band]["key"])[kept], ranks[kept]
        if not _bucket_ordered(keys, ranks):
            return None
        return _inserted(keys, ranks, new_keys, new_ranks)


def _bucket_ordered(keys: np.ndarray, ranks: np.ndarray) -> bool:
    """Whether entries are sorted by (key, rank): keys are already (the index's order)."""
    return bool(np.all((keys[1:] != keys[:-1]) | (ranks[1:] > ranks[:-1])))


def _inserted(
    keys: np.ndarray, ranks: np.ndarray, new_keys: np.ndarray, new_ranks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, ranks)`` with the new entries inserted where a sort by (key, rank) puts them."""
    by = np.lexsort((new_ranks, new_keys))
    new_keys, new_ranks = new_keys[by], new_ranks[by]
    at = np.searchsorted(keys, new_keys, side="left")
    end = np.searchsorted(keys, new_keys, side="right")
    for i in np.flatnonzero(end > at).tolist():  # a bucket the parent had: place by rank
        at[i] += int(np.searchsorted(ranks[at[i] : end[i]], new_ranks[i]))
    return np.insert(keys, at, new_keys), np.insert(ranks, at, new_ranks)


def keys_of_rows(
    signature_chunks: Sequence[SignatureBlock],
    starts: np.ndarray,
    rows: np.ndarray,
    band: int,
    per_band: int,
) -> np.ndarray:
    """One band's keys of the given partition rows, reading only the chunks holding them."""
    out = np.empty(len(rows), dtype=np.uint64)
    chunk_of = np.searchsorted(starts, rows, side="right") - 1
    for chunk in np.unique(chunk_of).tolist():
        at = np.flatnonzero(chunk_of == chunk)
        columns = signature_chunks[chunk].band(band, per_band)[:, rows[at] - starts[chunk]]
        out[at] = band_keys(columns, band)
    return out


Bands = Iterator[tuple[np.ndarray, np.ndarray]]  # per band: keys in bucket order, their ranks


class Banding:
    """Where each class run's bands come from (the parent's index, else a full sort) and where
    they go (this run's index, one file per class in ``folder``)."""

    def __init__(
        self,
        signature_chunks: Sequence[SignatureBlock],
        starts: np.ndarray,
        params: LshParams,
        folder: Path,
        parent: dict[str, Path] | None = None,
        parent_to_child: np.ndarray | None = None,
    ) -> None:
        """``starts``: each signature chunk's first partition row (and the total after the
        last); ``parent``: the parent's index file per class, with ``parent_to_child`` its
        rows as this partition's (negative: gone)."""
        self.chunks, self.starts, self.params = signature_chunks, starts, params
        self.folder, self.parent, self.parent_to_child = folder, parent or {}, parent_to_child
        self.written: dict[str, Path] = {}
        self.work = {"band_classes_incremental": 0, "band_keys_computed": 0}

    def incremental(self, name: str) -> bool:
        """Whether the class's bands come from its parent's index."""
        return name in self.parent and self.parent_to_child is not None

    def runner_index(self, name: str, n: int) -> IndexWriter:
        """The class's index file, for bands the task runner's reduce tasks sorted."""
        self.work["band_keys_computed"] += n * self.params.bands
        return self._writer(name, n)

    def bands(self, name: str, order: np.ndarray) -> Bands:
        """The class's bands, each written to its index as it passes."""
        writer = self._writer(name, len(order))
        source = self._from_parent(name, order) if self.incremental(name) else self._full(order)
        for keys, ranks in source:
            writer.add(keys, order[ranks])
            yield keys, ranks
        writer.close()

    def _writer(self, name: str, n: int) -> IndexWriter:
        path = self.folder / f"bands-{len(self.written):04d}.npy"
        self.written[name] = path
        return IndexWriter(path, self.params.bands, n)

    def _full(self, order: np.ndarray) -> Bands:
        self.work["band_keys_computed"] += len(order) * self.params.bands
        for band in range(self.params.bands):
            yield self._full_band(order, band)

    def _full_band(self, order: np.ndarray, band: int) -> tuple[np.ndarray, np.ndarray]:
        return sorted_band(band_keys_of(self.chunks, band, self.params.rows)[order])

    def _from_parent(self, name: str, order: np.ndarray) -> Bands:
        assert self.parent_to_child is not None
        rank_of = np.full(int(self.starts[-1]), -1, dtype=np.int64)
        rank_of[order] = np.arange(len(order), dtype=np.int64)
        parent = ParentBands.open(self.parent[name], self.parent_to_child, rank_of)
        new_ranks = parent.missing(len(order))
        self.work["band_classes_incremental"] += 1
        for band in range(self.params.bands):
            new_keys = keys_of_rows(
                self.chunks, self.starts, order[new_ranks], band, self.params.rows
            )
            self.work["band_keys_computed"] += len(new_ranks)
            merged = parent.band(band, new_ranks, new_keys)
            if merged is None:  # survivors out of order: this band sorted in full
                self.work["band_keys_computed"] += len(order)
                merged = self._full_band(order, band)
            yield merged
