"""Each row's verdict, direct match and its Jaccard, held for the rows not kept only.

Every removed row is an edge's end (an exact copy and its representative, a near duplicate and
its match) and every excluded one an exclusion, so the driver holds O(edges) here: a dense
verdict code and match row per record were 5 bytes a record. Readers ask for rows and get the
dense arrays back, a slice at a time: :meth:`Verdicts.look` finds any rows with one search of
the held rows, :meth:`Verdicts.span` a range of rows without one.
"""

from typing import NamedTuple

import numpy as np

from corpus_assets.core.dedup.order import code_dtype, sorted_hits

KEEP, EXACT, NEAR, EXCLUDED = "keep", "exact_duplicate", "near_duplicate", "excluded"
VERDICTS = (KEEP, EXACT, NEAR, EXCLUDED)  # by code
KEEP_CODE, EXACT_CODE, NEAR_CODE, EXCLUDED_CODE = range(len(VERDICTS))


class Looked(NamedTuple):
    """Rows with their verdict codes (int8) and direct match rows (-1: none)."""

    rows: np.ndarray
    verdict: np.ndarray
    match: np.ndarray


class EdgeRows(NamedTuple):
    """The edges by row (``code_dtype``): exact (copy -> its key's representative), then
    verified near (the later record first), with the near ones' Jaccards (an exact edge's is
    1.0: not held)."""

    a: np.ndarray
    b: np.ndarray
    exact: int  # the first ``exact`` edges are exact
    near_jaccard: np.ndarray

    @property
    def jaccard(self) -> np.ndarray:
        """Every edge's Jaccard."""
        return np.concatenate([np.ones(self.exact), self.near_jaccard])


class Jaccards:
    """The near duplicates' match Jaccards (a dense float64 array was 8 bytes a record); an
    exact copy's is 1.0, a row without a match has none (NaN)."""

    def __init__(self) -> None:
        self.rows = np.empty(0, dtype=np.int64)
        self.values = np.empty(0, dtype=np.float64)

    def set_near(self, rows: np.ndarray, values: np.ndarray) -> None:
        by = np.argsort(rows, kind="stable")
        self.rows, self.values = np.asarray(rows)[by], np.asarray(values, np.float64)[by]

    def of(self, looked: Looked) -> np.ndarray:
        """Each looked-up row's match Jaccard."""
        out = np.where(looked.verdict == EXACT_CODE, 1.0, np.nan)
        near = np.flatnonzero(looked.verdict == NEAR_CODE)
        if len(near):
            out[near] = self.values[np.searchsorted(self.rows, looked.rows[near])]
        return out


class Verdicts:
    """Per row: its verdict code and direct match row, held for the rows not kept; and the
    near duplicates' Jaccards (``jaccard``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows = np.empty(0, dtype=code_dtype(n))  # ascending
        self.codes = np.empty(0, dtype=np.int8)
        self.matches = np.empty(0, dtype=code_dtype(n))
        self.jaccard = Jaccards()

    def set(self, rows: np.ndarray, code: int, match: np.ndarray | None = None) -> None:
        """``rows``, none of them set before, get ``code`` and ``match`` (-1 when None)."""
        dtype = self.rows.dtype
        match = np.full(len(rows), -1, dtype) if match is None else np.asarray(match, dtype)
        rows = np.concatenate([self.rows, np.asarray(rows, dtype)])
        by = np.argsort(rows, kind="stable")
        self.rows = rows[by]
        if len(rows) > 1 and not (np.diff(self.rows) > 0).all():
            raise ValueError("a row's verdict was set twice")
        codes = np.concatenate([self.codes, np.full(len(match), code, dtype=np.int8)])
        self.codes, self.matches = codes[by], np.concatenate([self.matches, match])[by]

    def look(self, rows: np.ndarray) -> Looked:
        """``rows`` (any order, repeats) with their verdicts and matches: one search."""
        rows = np.asarray(rows)
        at, hit = sorted_hits(self.rows, rows)
        verdict = np.full(len(rows), KEEP_CODE, dtype=np.int8)
        match = np.full(len(rows), -1, dtype=self.matches.dtype)
        verdict[hit], match[hit] = self.codes[at[hit]], self.matches[at[hit]]
        return Looked(rows, verdict, match)

    def span(self, lo: int, hi: int) -> Looked:
        """Rows ``lo`` to ``hi - 1``: the held rows among them placed, no search per row."""
        a, b = np.searchsorted(self.rows, [lo, hi])
        verdict = np.full(hi - lo, KEEP_CODE, dtype=np.int8)
        match = np.full(hi - lo, -1, dtype=self.matches.dtype)
        at = self.rows[a:b] - lo
        verdict[at], match[at] = self.codes[a:b], self.matches[a:b]
        return Looked(np.arange(lo, hi, dtype=np.int64), verdict, match)

    def match(self, rows: np.ndarray) -> np.ndarray:
        """Each of ``rows``' direct match row (-1: none)."""
        return self.look(rows).match

    def representatives(self, looked: Looked) -> np.ndarray:
        """The kept row each looked-up row stands behind (-1 for excluded); chains end at a
        keep: an exact copy's representative may be a near duplicate, whose match is kept."""
        final = np.where(looked.verdict == KEEP_CODE, looked.rows, looked.match)
        exact = np.flatnonzero(looked.verdict == EXACT_CODE)
        rep = self.look(looked.match[exact])
        final[exact] = np.where(rep.verdict == NEAR_CODE, rep.match, rep.rows)
        final[looked.verdict == EXCLUDED_CODE] = -1
        return final

    def per_source(self, sources: np.ndarray, names: list[str]) -> dict[str, dict[str, int]]:
        """Verdict counts per source name (``sources``: each row's code into ``names``), every
        verdict listed (zeros too), the sources with rows only, by name."""
        totals = np.bincount(sources, minlength=len(names))[: len(names)]
        return self.per_source_held(totals, sources[self.rows], names)

    def per_source_held(
        self, totals: np.ndarray, held_sources: np.ndarray, names: list[str]
    ) -> dict[str, dict[str, int]]:
        """The same from each source's row count and the source codes of the rows not kept
        only (the rows held here, in their order): no code per row is needed."""
        counts = np.zeros((len(names), len(VERDICTS)), dtype=np.int64)
        counts[:, KEEP_CODE] = totals
        np.add.at(counts, (held_sources, self.codes), 1)
        np.subtract.at(counts[:, KEEP_CODE], held_sources, 1)
        out = {
            name: dict(zip(VERDICTS, counts[code].tolist(), strict=True))
            for code, name in enumerate(names)
            if counts[code].sum()
        }
        return dict(sorted(out.items()))
