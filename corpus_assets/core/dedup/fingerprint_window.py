"""The deletion scan's fingerprints, fetched a window at a time just before first use and
dropped after last use (:mod:`.near_dedup`)."""

from collections.abc import Callable

import numpy as np


class FingerprintWindow:
    """Fingerprints fetched a window at a time, just before first use, dropped after last use,
    so memory follows the records in flight rather than every record that collided."""

    WINDOW = 1024

    def __init__(
        self, xs: np.ndarray, ys: np.ndarray, fetch: Callable[[np.ndarray], list[np.ndarray]]
    ) -> None:
        self.fetched = self.dropped = 0
        self.fetch = fetch
        self.live: dict[int, np.ndarray] = {}
        self.late: dict[int, np.ndarray] = {}  # fetched on demand: pairs not scheduled
        self.late_fetched = 0
        records = np.concatenate([xs, ys])
        if not len(records):
            empty = np.empty(0, dtype=np.int64)
            self.involved = self.fetch_order = self.fetch_at = empty
            self.drop_order = self.drop_at = empty
            return
        times = np.concatenate([xs, xs])  # a record is used while its pair's x is scanned
        by_record = np.lexsort((times, records))
        records, times = records[by_record], times[by_record]
        starts = np.flatnonzero(np.r_[True, records[1:] != records[:-1]])
        ends = np.r_[starts[1:], len(records)] - 1
        self.involved = records[starts]
        first, last = times[starts], times[ends]
        by_first = np.argsort(first, kind="stable")
        self.fetch_order, self.fetch_at = self.involved[by_first], first[by_first]
        by_last = np.argsort(last, kind="stable")
        self.drop_order, self.drop_at = self.involved[by_last], last[by_last]

    def get(self, record: int) -> np.ndarray:
        """A record's fingerprints: scheduled ones from the window, others fetched now (kept
        for a window's worth of such records: a child re-verifies few old pairs)."""
        found = self.live.get(record)
        if found is None:
            found = self.late.get(record)
        if found is None:
            if len(self.late) >= self.WINDOW:
                self.late.clear()
            found = self.late[record] = self.fetch(np.array([record], dtype=np.int64))[0]
            self.late_fetched += 1
        return found

    def before(self, x: int) -> None:
        """Make sure every record first used at scan position ``x`` is loaded."""
        if self.fetched < len(self.fetch_order) and self.fetch_at[self.fetched] <= x:
            end = min(self.fetched + self.WINDOW, len(self.fetch_order))
            end = max(end, int(np.searchsorted(self.fetch_at, x, side="right")))
            batch = self.fetch_order[self.fetched : end]
            self.live.update(zip(batch.tolist(), self.fetch(batch), strict=True))
            self.fetched = end

    def after(self, x: int) -> None:
        """Forget every record whose last use was at scan position ``x``."""
        end = int(np.searchsorted(self.drop_at, x, side="right"))
        for record in self.drop_order[self.dropped : end].tolist():
            self.live.pop(record, None)
        self.dropped = max(self.dropped, end)
