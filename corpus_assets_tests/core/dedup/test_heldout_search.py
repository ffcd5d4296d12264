"""The held-out search's vectorised candidates and its known Jaccards change no pair.

Synthetic signatures where records of a family share random bands (in two blocks, so rows
are global across blocks): the candidates must be exactly the pairs a plain double loop over
every band finds, and a search told some Jaccards (nan for the rest) must return the same
pairs and Jaccards as one computing them all, fingerprinting only what it was not told.
"""

import weakref
from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.dedup import heldout_search, pair_set, spilled_prints
from corpus_assets.core.dedup.heldout_search import (
    HeldoutParams,
    _prefilter,
    agreement,
    candidates,
    search,
    side_candidates,
)
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.near_dedup import RowMajor, band_keys
from corpus_assets.core.dedup.signature_cache import BandMajorFile, band_major_npy

PARAMS = HeldoutParams(num_perm=24, threshold=0.5, rows=3)


def _families(rng: np.random.Generator, n: int) -> tuple[list[RowMajor], list[np.ndarray]]:
    sigs = rng.integers(0, 2**32, size=(n, PARAMS.num_perm), dtype=np.uint32)
    sets = []
    for r in range(n):
        head = r - r % 6
        keep = rng.random(PARAMS.num_perm) < 0.8
        sigs[r, keep] = sigs[head, keep]
        base = np.arange(head * 100, head * 100 + 60, dtype=np.uint64)
        base[rng.integers(0, 60, size=int(rng.integers(0, 20)))] += np.uint64(50_000)
        sets.append(np.unique(base))
    cut = n // 3
    return [RowMajor(sigs[:cut]), RowMajor(sigs[cut:])], sets


def _plain(blocks: list[RowMajor], heldout: np.ndarray, members: np.ndarray) -> set:
    """Pairs (a < b) of a held-out record and a member sharing a band key, by double loop."""
    out = set()
    held, mem = set(heldout.tolist()), members.tolist()
    for band in range(PARAMS.bands):
        keys = np.concatenate([band_keys(b.band(band, PARAMS.rows), band) for b in blocks])
        for h in held:
            for m in mem:
                if h != m and keys[h] == keys[m]:
                    out.add((min(h, m), max(h, m)))
    return out


@pytest.mark.parametrize(("seed", "table_bits"), [(0, 16), (1, 16), (2, 1), (3, 1)])
def test_candidates_are_the_double_loops_pairs(
    seed: int, table_bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the found pairs' table starts large or at 2 slots (grown many times)."""
    monkeypatch.setattr(pair_set, "TABLE_BITS", table_bits)
    rng = np.random.default_rng(seed)
    blocks, _ = _families(rng, 90)
    members = np.sort(rng.choice(90, 80, replace=False))
    heldout = np.sort(rng.choice(members, 15 + seed * 10, replace=False))
    packed = candidates(blocks, heldout, members, PARAMS, 90)
    found = {(int(a), int(b)) for a, b in zip(*np.divmod(packed, 90), strict=True)}
    assert found == _plain(blocks, heldout, members) and len(found) > 0
    assert packed.tolist() == sorted(packed.tolist())


@pytest.mark.parametrize("seed", range(4))
def test_known_jaccards_give_the_same_pairs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks, sets = _families(rng, 90)
    members = np.arange(90)
    heldout = np.sort(rng.choice(90, 20, replace=False))
    fetched: list[int] = []

    def fingerprints(rows: np.ndarray) -> list[np.ndarray]:
        fetched.extend(rows.tolist())
        return [sets[r] for r in rows]

    def known(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        exact = [jaccard_sorted(sets[x], sets[y]) for x, y in zip(a, b, strict=True)]
        return np.where(rng.random(len(a)) < 0.7, exact, np.nan)

    full = search(blocks, heldout, members, PARAMS, fingerprints)
    every = len(fetched)
    fetched.clear()
    told = search(blocks, heldout, members, PARAMS, fingerprints, known=known)
    assert full.a.tolist() == told.a.tolist() and full.b.tolist() == told.b.tolist()
    assert full.jaccard.tolist() == told.jaccard.tolist() and len(full.a) > 0
    for x, y in zip(told.verified, full.verified, strict=True):
        assert x.tolist() == y.tolist()
    assert (
        told.stats["known"] > 0
        and told.stats["computed"] == full.stats["estimated"] - (told.stats["known"])
    )
    assert len(fetched) == told.stats["fingerprinted"] < every


def test_no_candidate_array_is_held_while_texts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's peak is its verification reading texts: by then the candidates (packed and
    unpacked) are gone, only the pairs the estimate kept are held."""
    rng = np.random.default_rng(7)
    blocks, sets = _families(rng, 90)
    made: list[weakref.ref] = []
    find, keep = heldout_search.candidates, heldout_search.likely_pairs

    def candidates_made(*args: object) -> np.ndarray:
        packed = find(*args)
        made.append(weakref.ref(packed))
        return packed

    def likely_kept(blocks: object, a: np.ndarray, b: np.ndarray, p: HeldoutParams) -> object:
        made.extend([weakref.ref(a), weakref.ref(b)])
        return keep(blocks, a, b, p)

    monkeypatch.setattr(heldout_search, "candidates", candidates_made)
    monkeypatch.setattr(heldout_search, "likely_pairs", likely_kept)
    alive: list[int] = []

    def fingerprints(rows: np.ndarray) -> list[np.ndarray]:
        alive.append(sum(ref() is not None for ref in made))
        return [sets[r] for r in rows]

    found = search(blocks, np.arange(0, 90, 5), np.arange(90), PARAMS, fingerprints)
    assert len(made) == 3 and len(found.a) > 0
    assert alive and alive[0] == 0  # every candidate array freed before the first text


def test_the_prefilter_lets_few_members_through_for_a_few_moved_records() -> None:
    """A child searches its few moved records against every member: the bitmap keeps under
    0.5 % of 200,000 unrelated members for 1,000 held-out values (every kept one costs a band
    key, a sort and a binary search; a 64k-slot bitmap let 1.5 % through)."""
    rng = np.random.default_rng(5)
    held = rng.integers(0, 2**32, size=1_000, dtype=np.uint32)
    probe = rng.integers(0, 2**32, size=200_000, dtype=np.uint32)
    kept = _prefilter(held, probe)
    assert len(kept) < 1_000, len(kept)
    assert set(np.flatnonzero(np.isin(probe, held))) <= set(kept.tolist())  # no true hit lost


def _band_major_files(
    blocks: list[RowMajor], folder: Path, perms: int = PARAMS.num_perm
) -> list[BandMajorFile]:
    """The blocks written as band-major signature files, opened."""
    files = []
    for i, block in enumerate(blocks):
        path = folder / f"{i}.npy"
        path.write_bytes(band_major_npy(block.band(0, perms).T))
        files.append(BandMajorFile.open(path))
    return files


def test_agreement_reads_a_signature_files_values_of_the_pairs_records_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over band-major signature files, the agreement of a few pairs is that of the same
    signatures in memory, and no permutation row of every record is read."""
    blocks, _ = _families(np.random.default_rng(7), 60)
    files = _band_major_files(blocks, tmp_path)
    read: list[int] = []
    whole = BandMajorFile.band

    def counted(self: BandMajorFile, band: int, rows: int) -> np.ndarray:
        read.append(rows * self.records)
        return whole(self, band, rows)

    monkeypatch.setattr(BandMajorFile, "band", counted)
    a, b = np.array([0, 1, 30, 6]), np.array([2, 5, 31, 50])
    expected = agreement(blocks, a, b, PARAMS.num_perm)
    assert (expected > 0).any()
    read.clear()
    assert agreement(files, a, b, PARAMS.num_perm).tolist() == expected.tolist()
    assert sum(read) <= sum(f.records for f in files), read  # the blocks' sizes, once at most


def test_candidates_over_signature_files_read_a_bands_first_row_and_the_hits_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over band-major files the candidates are those in memory; no band of every record is
    read (the prefilter reads a band's first row, the keys only the records it lets through)."""
    rng = np.random.default_rng(3)
    blocks, _ = _families(rng, 90)
    files = _band_major_files(blocks, tmp_path)
    bands: list[int] = []
    whole = BandMajorFile.band

    def counted(self: BandMajorFile, band: int, rows: int) -> np.ndarray:
        bands.append(rows)
        return whole(self, band, rows)

    monkeypatch.setattr(BandMajorFile, "band", counted)
    released: list[int] = []
    release = heldout_search._Mapped.release
    monkeypatch.setattr(
        heldout_search._Mapped, "release", lambda self: released.append(1) or release(self)
    )
    heldout, members = np.array([4, 40, 77]), np.arange(90)
    for moved in (None, np.array([5, 41, 60])):
        expected = candidates(blocks, heldout, members, PARAMS, 90, moved)
        assert len(expected)
        got = candidates(files, heldout, members, PARAMS, 90, moved)
        assert got.tolist() == expected.tolist()
        # every band's pages dropped from the process once read: the file never stays mapped in
        # (two passes: the small sides' key classes, then the search)
        assert len(released) == 2 * PARAMS.bands * len(files), len(released)
        released.clear()
    assert bands == [], bands


def test_verification_holds_a_window_of_fingerprint_sets_not_every_records(
    tmp_path: Path,
) -> None:
    """The sets are asked for in ascending windows (each row once) and spilled; the Jaccards
    are those of the sets held whole."""
    rng = np.random.default_rng(5)
    n = 3000
    sets = [np.unique(rng.integers(0, 400, size=int(rng.integers(1, 60)))).astype(np.uint64)]
    sets += [
        np.unique(rng.integers(0, 400, size=int(rng.integers(1, 60)))).astype(np.uint64)
        for _ in range(n - 1)
    ]
    a = rng.integers(0, 200, size=5000)
    b = rng.integers(200, n, size=5000)
    asked: list[np.ndarray] = []

    def fingerprints(rows: np.ndarray) -> list[np.ndarray]:
        asked.append(rows.copy())
        return [sets[r] for r in rows.tolist()]

    got, fingerprinted = spilled_prints.pair_jaccards(a, b, fingerprints, tmp_path)
    want = [jaccard_sorted(sets[x], sets[y]) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    np.testing.assert_array_equal(got, np.array(want))
    every = np.concatenate(asked)
    assert fingerprinted == len(every) == len(np.unique(np.r_[a, b]))
    assert bool(np.all(np.diff(every) > 0))  # ascending, each row once
    assert max(len(rows) for rows in asked) <= spilled_prints.SpilledPrints.WINDOW < len(every)


CLUSTERED = HeldoutParams(num_perm=30, threshold=0.5, rows=3)


def _clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    """``(n, num_perm)`` signatures: random records, and near-duplicate clusters (sizes 2 to
    24) whose records keep ~95% of their head's values, so most of a cluster's pairs share a
    key in nearly every band (the repeats the search drops), a few in only some."""
    sigs = rng.integers(0, 2**32, size=(n, CLUSTERED.num_perm), dtype=np.uint32)
    rows = rng.permutation(n)
    at = 0
    while at < n * 2 // 3:
        size = int(rng.integers(2, 25))
        cluster = rows[at : at + size]
        keep = rng.random((len(cluster), CLUSTERED.num_perm)) < 0.95
        sigs[cluster] = np.where(keep, sigs[cluster[0]], sigs[cluster])
        at += size
    return sigs


def _band_union(
    blocks: list[RowMajor], sides: list[tuple[np.ndarray, np.ndarray]], n: int
) -> tuple[np.ndarray, int]:
    """The oracle: every band's pairs of each side with equal keys (all against all), packed
    ``a * n + b`` (a < b), sorted unique; and how many band pairs there were with repeats."""
    found, total = [np.empty(0, dtype=np.int64)], 0
    for band in range(CLUSTERED.bands):
        keys = np.concatenate([band_keys(b.band(band, CLUSTERED.rows), band) for b in blocks])
        for held, members in sides:
            i, j = np.nonzero(keys[held][:, None] == keys[members][None, :])
            a, b = held[i], members[j]
            a, b = np.minimum(a, b)[a != b], np.maximum(a, b)[a != b]
            found.append(a.astype(np.int64) * n + b)
            total += len(a)
    return np.unique(np.concatenate(found)), total


@pytest.mark.parametrize(("seed", "n", "table_bits"), [(0, 301, 16), (1, 457, 1), (2, 613, 3)])
@pytest.mark.parametrize("files", [False, True])
@pytest.mark.parametrize("classes", [0, heldout_search.CLASSES])
def test_side_candidates_are_every_bands_pairs_once(
    seed: int,
    n: int,
    table_bits: int,
    files: bool,
    classes: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With clusters colliding in nearly every band and exact copies, several sides
    (overlapping, empty ones, held-out records among the members), blocks in memory or
    signature files, the found pairs' table starting small (grown, long probes) or not, and the
    small sides searched record by record or by key classes: exactly the oracle's array."""
    monkeypatch.setattr(pair_set, "TABLE_BITS", table_bits)
    monkeypatch.setattr(heldout_search, "CLASSES", classes)
    rng = np.random.default_rng(seed)
    sigs = _clustered(rng, n)
    copies = rng.choice(n, n // 5, replace=False)  # exact copies: one key class per band
    sigs[copies] = sigs[rng.choice(copies[: n // 20], len(copies))]
    cuts = sorted(rng.choice(np.arange(1, n), 2, replace=False).tolist())
    blocks = [RowMajor(part) for part in np.split(sigs, cuts)]
    members = np.sort(rng.choice(n, n * 4 // 5, replace=False))
    heldout = np.sort(rng.choice(n, n // 4, replace=False))
    moved = np.sort(rng.choice(members, n // 10, replace=False))
    sides = [
        (heldout, members),
        (heldout[np.isin(heldout, moved)], members),
        (heldout, moved),
        (moved, np.arange(n)),
        (np.empty(0, dtype=np.int64), members),
        (heldout, np.empty(0, dtype=np.int64)),
    ]
    expected, total = _band_union(blocks, sides, n)
    assert total > 5 * len(expected) > 0  # most pairs are found again in later bands
    searched = _band_major_files(blocks, tmp_path, CLUSTERED.num_perm) if files else blocks
    got = side_candidates(searched, sides, CLUSTERED, n)
    assert got.dtype == np.int64 and np.array_equal(got, expected)
    empty = side_candidates(searched, sides[4:], CLUSTERED, n)
    assert empty.dtype == np.int64 and len(empty) == 0


def test_a_small_sides_copies_are_searched_once_per_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies on the small side (the same key in every band) are searched as one record: a
    band adds each partner once, not once per copy, and the pairs are every copy's."""
    rng = np.random.default_rng(11)
    sigs = rng.integers(0, 2**32, size=(200, CLUSTERED.num_perm), dtype=np.uint32)
    sigs[100:140] = sigs[0]  # 41 copies of record 0: 0 and 100..139
    blocks = [RowMajor(sigs)]
    small, large = np.r_[0, np.arange(100, 130)], np.arange(200)
    added: list[int] = []
    add = pair_set.DistinctPairs.add
    monkeypatch.setattr(
        pair_set.DistinctPairs, "add", lambda self, p: added.append(len(p)) or add(self, p)
    )
    got = side_candidates(blocks, [(small, large)], CLUSTERED, 200)
    expected, _ = _band_union(blocks, [(small, large)], 200)
    assert np.array_equal(got, expected) and len(got) == 31 * 40 - 31 * 30 // 2
    assert max(added) <= 41  # one class against its 41 copies, not 31 x 41 pairs
