"""Where dedup's per-record facts come from: codes, the id order, repeated ids, exact copies.

:func:`.clusters.decide` asks a :class:`Coding` for them. Two give the same answers:

- :class:`DriverCoding`: the partition database's sorts (or the codes a child carried from its
  parent), then numpy over every row on the driver;
- :class:`.task_coding.TaskCoding`, where the stages run on the task runner: the sample sort's
  merge tasks decide repeated ids and exact copies next to the values they hold and put the
  near classes in total order, and the driver reads the id order, each row's leakage row and
  each class's rows from their files and receives the sparse answers (repeated rows, copies),
  never a code of every row nor an order of every row.

The answers are sparse where the facts are (repeated ids and copies are few next to the
records); the id order and the leakage rows are one integer per row.
"""

from typing import NamedTuple, Protocol

import numpy as np

from corpus_assets.core.dedup.class_rows import ClassOrder, HeldClass
from corpus_assets.core.dedup.leakage import leakage_rows
from corpus_assets.core.dedup.order import first_in_order
from corpus_assets.core.dedup.order_key import class_name
from corpus_assets.core.dedup.output_order import id_ranks
from corpus_assets.core.dedup.partition_db import Coded, PartitionDb, RecordCodes, code_dtype
from corpus_assets.core.dedup.row_values import HeldRows, Leakage, RowValues
from corpus_assets.core.dedup.verdicts import Verdicts

# Why an ``excluded`` row repeats an earlier row's record id: the same record again (same dedup
# key), or another text under the same id - quarantined, counted as ``id_conflicts``. Decided
# here, the first layer that sees the whole partition (a canonical chunk sees one object).
DUPLICATE_ID, ID_CONFLICT = "duplicate record_id", "id.conflict"


class Repeated(NamedTuple):
    """Rows whose record id appeared at an earlier row (ascending), that id's first row, and
    whether the dedup keys are equal (null equals null)."""

    rows: np.ndarray
    first: np.ndarray
    same: np.ndarray


# near-dedup class name -> its rows in total order (read as the class's run asks)
Classes = dict[str, ClassOrder]


class Exact(NamedTuple):
    """Among the eligible rows: the first of each dedup key (the representatives near-dedup
    looks at) by near-dedup class, and the later copies in total order with each copy's
    representative."""

    classes: Classes
    copies: np.ndarray
    match: np.ndarray


class Coding(Protocol):
    """The facts :func:`.clusters.decide` asks for, in the order it asks."""

    def codes(self, db: PartitionDb) -> RecordCodes: ...

    def rank_rows(self, db: PartitionDb, codes: RecordCodes) -> RowValues:
        """Each row's rank by record id, object, line and row (the total order's last keys),
        for the table positions and the stored decisions: read a slice at a time where the
        coding can (not held through the near stage or the output phases)."""
        ...

    def repeated(self, codes: RecordCodes) -> Repeated: ...

    def per_source(self, codes: RecordCodes, state: Verdicts) -> dict[str, dict[str, int]]:
        """The verdict counts by source (``state``'s, final)."""
        ...

    def exact(self, db: PartitionDb, codes: RecordCodes, excluded: np.ndarray) -> Exact:
        """The exact stage over the rows not ``excluded`` (ascending) in the stated total
        order (each source's rank, given at construction); the representatives by near-dedup
        class (kind / its source's content; one class "" without the contents)."""
        ...

    def leakage(self, codes: RecordCodes, a: np.ndarray, b: np.ndarray) -> Leakage:
        """Per row, the row naming its leakage group over the edges (a, b) between rows
        (:mod:`.leakage`), and how many groups."""
        ...


class DriverCoding:
    """Every fact from codes by row on the driver (``carried``: a child's record id, dedup key
    and group id codes from its parent, not sorted again; ``source_order``: each source's
    rank; ``content_of``: each source's content, which names the near classes)."""

    def __init__(
        self,
        carried: tuple[Coded, Coded, Coded] | None = None,
        source_order: dict[str, int] | None = None,
        content_of: dict[str, str] | None = None,
    ) -> None:
        self.carried, self.source_order, self.content_of = carried, source_order, content_of
        self._rank: np.ndarray | None = None

    def codes(self, db: PartitionDb) -> RecordCodes:
        return db.codes(self.carried)

    def id_rank(self, db: PartitionDb, codes: RecordCodes) -> np.ndarray:
        """Each row's rank by record id, object, line and row, ranked once and kept: the
        record id codes are dropped after the exact stage."""
        if self._rank is None:
            self._rank = id_ranks(db, codes.record_id.codes)
        return self._rank

    def rank_rows(self, db: PartitionDb, codes: RecordCodes) -> RowValues:
        return HeldRows(self.id_rank(db, codes))

    def repeated(self, codes: RecordCodes) -> Repeated:
        """Rows are in index order (source, object by name, line), so the first row of an id
        stays: a row appended later never displaces it, whatever its length."""
        id_codes = codes.record_id.codes
        tied = np.flatnonzero(np.bincount(id_codes)[id_codes] > 1) if len(id_codes) else id_codes
        if not len(tied):  # every id once (the usual case): no sort
            return no_repeats()
        first = first_in_order(id_codes[tied])
        repeated = tied[~first]
        first_row_of = np.empty(int(id_codes.max(initial=-1)) + 1, code_dtype(len(id_codes)))
        first_row_of[id_codes[tied[first]]] = tied[first]
        at = first_row_of[id_codes[repeated]]
        same = codes.dedup_key.codes[repeated] == codes.dedup_key.codes[at]
        return Repeated(repeated, at, same)

    def exact(self, db: PartitionDb, codes: RecordCodes, excluded: np.ndarray) -> Exact:
        """The total order sorted here (:meth:`.partition_db.PartitionDb.total_order`), the
        first of each dedup key among its eligible rows."""
        ranks = self.source_order or {}
        order = db.total_order(ranks, codes.source_id, self.id_rank(db, codes))
        eligible = _eligible(order, excluded)
        del order
        key_codes = codes.dedup_key.codes
        first = first_in_order(key_codes[eligible])
        rep_of = np.empty(int(key_codes.max(initial=-1)) + 1, dtype=code_dtype(len(key_codes)))
        rep_of[key_codes[eligible[first]]] = eligible[first]
        copies = eligible[~first]
        classes = near_classes(codes, eligible[first], self.content_of)
        return Exact(classes, copies, rep_of[key_codes[copies]])

    def per_source(self, codes: RecordCodes, state: Verdicts) -> dict[str, dict[str, int]]:
        return state.per_source(codes.source_id.codes, codes.source_id.values)

    def leakage(self, codes: RecordCodes, a: np.ndarray, b: np.ndarray) -> Leakage:
        rows = leakage_rows(codes.group_id.codes, a, b)
        groups = int(np.count_nonzero(np.bincount(rows))) if len(rows) else 0  # no sort
        return Leakage(HeldRows(rows), groups)


def _eligible(order: np.ndarray, excluded_rows: np.ndarray) -> np.ndarray:
    """The rows of ``order`` not excluded (``excluded_rows`` ascending), in its order."""
    if not len(excluded_rows):
        return order
    eligible = np.ones(len(order), dtype=bool)  # by row: a byte a row, no search temporaries
    eligible[excluded_rows] = False
    return order[eligible[order]]


def near_classes(
    records: RecordCodes, rows: np.ndarray, content_of: dict[str, str] | None
) -> Classes:
    """Class name (kind / its source's content) -> its ``rows``, still in their order;
    classes sorted by name (one class "" of every row without ``content_of``)."""
    if content_of is None:
        return {"": HeldClass(rows)}
    kind_codes, kind_names = records.kind.codes, records.kind.values
    source_codes, source_names = records.source_id.codes, records.source_id.values
    pair = kind_codes[rows].astype(np.int64) * len(source_names) + source_codes[rows]
    masks: dict[str, np.ndarray] = {}
    for code in np.unique(pair).tolist():
        kind, source = divmod(code, len(source_names))
        name = class_name(kind_names[kind], source_names[source], content_of)
        masks[name] = masks.get(name, False) | (pair == code)
    return {name: HeldClass(rows[mask]) for name, mask in sorted(masks.items())}


def no_repeats() -> Repeated:
    empty = np.empty(0, dtype=np.int64)
    return Repeated(empty, empty, np.empty(0, dtype=bool))


def exclusions(db: PartitionDb, repeated: Repeated, excluded: dict[int, str]) -> dict[int, str]:
    """``excluded`` plus every repeated row with its reason (a row revoked already keeps its
    tombstone's): a repeat with the same dedup key is the same record again (``duplicate
    record_id``); with another text it is an ``id.conflict``, quarantined and counted, never
    silently one of two."""
    if not len(repeated.rows):
        return excluded
    where = db.object_lines(np.unique(repeated.first))
    for row, first_row, same_text in zip(
        repeated.rows.tolist(), repeated.first.tolist(), repeated.same.tolist(), strict=True
    ):
        obj, line = where[first_row]
        if same_text:
            reason = f"{DUPLICATE_ID} (first at {obj} line {line})"
        else:
            reason = f"{ID_CONFLICT}: another text than the first at {obj} line {line}"
        excluded.setdefault(row, reason)
    return excluded
