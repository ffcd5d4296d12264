"""The held-out rule: no near-duplicate pair dedup missed may join a held-out split to another.

Near-dedup's LSH misses some pairs at the threshold edge (and a bucket cap skips some); two
such kept records hashed to train and test leak. After assignment every validation and test
member is searched against every record (members and the removed duplicates standing
behind them, in their representative's split) with ``dedup.heldout_search`` (many short bands, no
cap, exact Jaccard on the project's own shingles, each pair at the larger of its records'
thresholds). The pairs it finds join (leakage component, split) sides; a union spanning two
splits has its smaller sides moved to the largest (``split.heldout_near``, ties by split
order: the ``move_smaller`` resolution), each move listed with the pair and its Jaccard. They
are resolved here, so they are no open conflict (the layer check wants none).
The validation gate runs the same search on the published members table (``heldout_leaks``).

Every pair the search verified (text digests ``a < b``, exact Jaccard, identical texts left
out) is stored as ``heldout_verified``. A Jaccard depends on the two texts and the signature
spec only, so a later search takes it from there instead of reading and shingling the texts:
the child snapshot's splits layer from its parent's table, the gate from its own snapshot's
(each only when the layer that stored it ran this code and spec), both from the dedup layer's
verified ``pairs`` (when it ran the current dedup code).

Whether a pair is a candidate, estimated and above its threshold depends on its two records
only (their texts, and which of them is held out) under the spec and thresholds. So the search
also stores its state, ``heldout_state``: per global canonical row its status (not searched,
member, held out) and every pair it estimated, with the exact Jaccard. A child whose parent's
splits layer ran this code under this policy, spec and thresholds (``heldout_rule``) maps the
parent's rows to its own through the records tables they share (the same digest holds the same
records in the same order), takes the parent's pairs of two rows whose status is unchanged,
and searches only the pairs with a new or changed row. Its outputs are the bytes a full search
writes; without such a parent state (none, other code, collected) it searches every pair.
"""

from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.dedup_clusters import CODE as DEDUP_CODE
from corpus_assets.core.dedup.fingerprint_store import TextLookup
from corpus_assets.core.dedup.heldout_search import HeldoutPairs, HeldoutParams, Known, search
from corpus_assets.core.dedup.minhash import SignatureSpec, spec_payload
from corpus_assets.core.dedup.near_rule import CHAR, ScriptThresholds
from corpus_assets.core.dedup.pair_cache import PAIR_COLUMNS as VERIFIED_COLUMNS
from corpus_assets.core.dedup.report import DedupReport
from corpus_assets.core.dedup.signature_cache import BandMajorFile, file_rows, load_modes
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, get_json
from corpus_assets.core.storage.cas_queries import (
    VerifiedFiles,
    cas_parquet,
    put_query,
    registered,
    sql_list,
    sql_path,
)
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.memory import hand_back_duckdb
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.training_view.splits.heldout_known import distinct_rows, known_jaccards
from corpus_assets.core.training_view.splits.heldout_rows import (
    EMPTY_ROWS,
    POSITIONS,
    Members,
    Represented,
    row_order,
)
from corpus_assets.core.training_view.splits.heldout_state import (
    STATE_COLUMNS,
    PriorSearch,
    state_table,
    union_pairs,
)
from corpus_assets.core.training_view.splits.heldout_tasks import (
    RowDigests,
    fingerprint_rows,
    pooled_search,
)
from corpus_assets.core.training_view.splits.schema import TRAIN
from corpus_assets.core.training_view.view_queries import SORT_LIMIT

# The verified pairs as numbers of the distinct rows they name (``ho_estimated``: ra, rb) and
# those rows' digests (``ho_row_digests``: r, digest), both Arrow tables of exact row counts
VERIFIED = """
CREATE OR REPLACE TEMP TABLE ho_verified AS
SELECT least(x, y) AS a, greatest(x, y) AS b, min(jaccard) AS jaccard
FROM (SELECT dx.digest AS x, dy.digest AS y, e.jaccard FROM ho_estimated e
      JOIN ho_row_digests dx ON e.ra = dx.r JOIN ho_row_digests dy ON e.rb = dy.r)
WHERE x <> y GROUP BY ALL
"""
UNSEARCHED, MEMBER, HELD = 0, 1, 2  # a row's part in the search (``status``)
FULL, INCREMENTAL = "full", "incremental"
Searched = tuple[LayerIndex | None, str, str]  # a splits index, the code it must have, a name


@dataclass(frozen=True)
class Reuse:
    """Where the search takes Jaccards computed before (SQL relations of text-digest pairs),
    and why (or why not) from a previous search's table."""

    mode: str
    reason: str
    tables: tuple[str, ...] = ()

    def details(self) -> dict[str, str]:
        return {"mode": self.mode, "reason": self.reason}


def spec_digest(spec: SignatureSpec) -> str:
    """What the stored Jaccards were computed under (recorded as ``heldout_spec``)."""
    return json_digest(spec_payload(spec))


def reuse(ws: Workspace, dedup: LayerIndex, spec: SignatureSpec, searched: Searched) -> Reuse:
    """The tables a search may take Jaccards from: a previous search's ``heldout_verified``
    when its splits layer ran ``code`` under this spec, and dedup's verified pairs when the
    dedup layer ran the current dedup code."""
    tables = []
    if dedup.code == DEDUP_CODE and _stored(ws, dedup, "pairs"):
        tables.append(cas_parquet(ws.cas, dedup.output("pairs"), "dedup verified pairs"))
    index, code, who = searched
    if index is None:
        return Reuse(FULL, f"no {who}", tuple(tables))
    if index.code != code:
        return Reuse(FULL, f"{who} ran other splits code", tuple(tables))
    if index.outputs.get("heldout_spec") != spec_digest(spec) or (
        "heldout_verified" not in index.outputs
    ):
        return Reuse(FULL, f"{who} stored no verified pairs under this spec", tuple(tables))
    if not _stored(ws, index, "heldout_verified"):  # collected: computed again, not trusted
        return Reuse(FULL, f"{who}'s verified pairs are gone from the store", tuple(tables))
    table = cas_parquet(ws.cas, index.output("heldout_verified"), f"{who} heldout_verified")
    return Reuse(INCREMENTAL, who, (table, *tables))


def _stored(ws: Workspace, index: LayerIndex, output: str) -> bool:
    """Whether the layer has ``output`` and its object is still in the CAS."""
    return output in index.outputs and ws.cas.contains(index.output(output)["digest"])


@dataclass(frozen=True)
class HeldoutScan:
    """What the search reads of a built partition: the dedup layer's cached signatures, the
    canonical texts and the thresholds its report names."""

    ws: Workspace
    chunks: list[ChunkRecords]
    blocks: list[BandMajorFile]
    spec: SignatureSpec
    thresholds: np.ndarray  # per global row
    params: HeldoutParams
    rule: ScriptThresholds
    files: VerifiedFiles  # how the canonical tables are read (verified, or trusted unchanged)
    order: str | None = None  # the dedup decisions table's path (``row_order``)

    @classmethod
    def open(
        cls,
        ws: Workspace,
        chunks: list[ChunkRecords],
        dedup: LayerIndex,
        files: VerifiedFiles | None = None,
    ) -> "HeldoutScan | None":
        """The scan of a partition whose dedup layer is ``dedup`` (None without near-dedup:
        no signatures, no near pairs to look for); ``files`` reads its signatures and canonical
        tables (by default trusted while unchanged since they last hashed right)."""
        report = DedupReport.parse(get_json(ws.cas, dedup.output("report"), "dedup report"))
        near = report.near
        if near is None:
            return None
        payload = near.signature
        spec = SignatureSpec(
            version=payload["version"],
            num_perm=payload["num_perm"],
            seed=payload["seed"],
            shingle_words=payload["shingle_words"],
            shingle_chars=payload["shingle_chars"],
        )
        files = files if files is not None else TrustedFiles(ws.cas, ws.catalog)
        refs = {s["chunk"]: s["signatures"] for s in dedup.outputs["signatures"]}
        blocks = [_signatures(files, c, refs[c.key]["digest"], spec) for c in chunks]
        word = Decimal(near.lsh.threshold)
        char = [Decimal(r.threshold) for r in near.near_dedup_by_script if r.script == CHAR]
        rule = ScriptThresholds(word, max([word, *char]))
        modes = load_modes(blocks, spec)
        total = sum(c.count for c in chunks)
        taus = rule.by_rank(modes) if modes is not None else np.full(total, float(word))
        params = HeldoutParams(spec.num_perm, float(word))
        order = row_order(files, dedup, total)
        return cls(ws, chunks, blocks, spec, taus, params, rule, files, order)

    def pairs(
        self,
        con: duckdb.DuckDBPyConnection,
        members: str | Represented,
        known: Reuse | None = None,
        keep: bool = True,
        changed: pa.Array | None = None,
    ) -> tuple[pa.Table, dict]:
        """Every pair (a held-out member, any member) at or above its threshold, as
        ``PAIR_COLUMNS`` rows in (a, b) row order, and the search's counts. ``members`` is a
        query over ``con`` with columns record_id, object, line, split (``searched_records``),
        or ``Represented``;
        Jaccards are taken from ``known``'s tables where they hold the pair. With ``keep``,
        every verified pair is left in ``con`` as ``ho_verified`` (for ``put_verified``).
        With ``changed`` (record ids), only the pairs with at least one of them."""
        table, stats, _ = self.searched(con, members, known, keep, changed)
        return table, stats

    def searched(
        self,
        con: duckdb.DuckDBPyConnection,
        members: str | Represented,
        known: Reuse | None = None,
        keep: bool = True,
        changed: pa.Array | None = None,
        prior: PriorSearch | None = None,
    ) -> tuple[pa.Table, dict, pa.Table]:
        """``pairs``, and the search's state (``STATE_COLUMNS``, one row per global row, with
        ``keep``) for a later search to start from. With ``prior`` (a parent's state), only
        the pairs with a record new or changed against it are searched; the others are the
        parent's."""
        found_in = self._positions(con, members)
        rows = found_in.rows
        heldout = rows[found_in.held]
        tables = known.tables if known is not None else ()
        look_up = (partial(known_jaccards, con, tables, found_in.digests), tables)
        status = np.zeros(len(self.thresholds), dtype=np.int8)
        status[rows] = np.where(found_in.held, HELD, MEMBER)
        if prior is not None:
            same = prior.unchanged(status)
            moved = rows[~same[rows]]
            found = self._search(heldout, rows, look_up, moved)
            found = union_pairs(found, prior.pairs(same, self.thresholds))
        elif changed is None:
            found = self._search(heldout, rows, look_up)
        else:
            found = self._search(heldout, rows, look_up, found_in.named(changed))
        if keep:
            _store_verified(con, found_in.digests, *found.verified)
        table = found_in.pairs(found)
        found_in.close()
        stats = {"heldout": len(heldout), "members": len(rows), **found.stats}
        state = state_table(status, *found.verified) if keep else STATE_COLUMNS.empty_table()
        return table, stats, state

    def _positions(self, con: duckdb.DuckDBPyConnection, members: str | Represented) -> Members:
        """The members' global canonical rows and whether each is held out; their record ids
        (or clusters positions) and splits stay in ``con`` (``ho_members``), and text digests in
        the chunk tables, until pairs ask for them. The rows come from one SQL join, which
        DuckDB runs within its cap: the canonical tables' ids and objects in Arrow, and their
        lookup, raised a 1.1 GB build's peak by ~250 MB; all members' ids and splits in Arrow,
        by ~100 MB more. ``Represented`` members are found by the dedup decisions table."""
        if not self.chunks:
            return Members(EMPTY_ROWS, np.empty(0, bool), None, RowDigests(self.ws, []))
        digests = RowDigests(self.ws, self.chunks)
        paths = [self.files.path(c.records["digest"], c.what) for c in self.chunks]  # checked
        if isinstance(members, Represented) and self.order is not None:
            found = members.positions(con, self.order)
            if found is not None:  # read where it is (``Members.close`` unregisters it)
                con.execute("DROP TABLE IF EXISTS ho_members")
                con.register("ho_members", found)
                split = found["split"].combine_chunks()
                names = np.asarray(split.dictionary.to_pylist(), dtype=object)
                held = (names != TRAIN)[split.indices.to_numpy()]
                rows = found["row"].to_numpy()
                hand_back_duckdb(con)  # the reads' pages, before the search
                return Members(rows, held, con, digests, True, members.named("ho_members"))
            query = members.query(con, sql_path(self.order))
            return self._created(con, query, digests, members.named("ho_members"))
        if isinstance(members, Represented):
            members = members.records()
        return self._joined(con, members, paths, digests)

    def _joined(
        self,
        con: duckdb.DuckDBPyConnection,
        members: str,
        paths: list[str],
        digests: RowDigests,
    ) -> Members:
        """``_positions`` as one SQL join on (record id, object, line)."""
        starts = np.cumsum([0, *(c.count for c in self.chunks)])[:-1].tolist()
        con.register("ho_files", pa.table({"filename": paths, "start": starts}))
        try:
            query = POSITIONS.format(paths=sql_list(paths), members=members)
            return self._created(con, query, digests)
        finally:
            con.unregister("ho_files")

    def _created(
        self,
        con: duckdb.DuckDBPyConnection,
        query: str,
        digests: RowDigests,
        named: str = "ho_members",
    ) -> Members:
        """``ho_members`` from ``query`` (row, record_id or pos, split), and its rows read back;
        ``named``: the relation (row, record_id, split) over it."""
        con.execute(f"CREATE OR REPLACE TEMP TABLE ho_members AS {query}")
        found = con.sql(
            f"SELECT row, split <> '{TRAIN}' AS held FROM ho_members ORDER BY row"
        ).fetchnumpy()
        rows = np.asarray(found["row"], dtype=np.int64)
        single = bool(np.all(rows[1:] > rows[:-1]))  # each row once, as it is listed
        held = np.asarray(found["held"], dtype=bool)
        return Members(rows, held, con, digests, single, named)

    def _search(
        self,
        heldout: np.ndarray,
        rows: np.ndarray,
        known: tuple[Known, tuple[str, ...]],
        moved: np.ndarray | None = None,
    ) -> HeldoutPairs:
        """The search on the runner's workers (one task per chunk group) when it wants them,
        else here; the same pairs either way. ``known``: the lookup and its tables."""
        pooled = pooled_search(self, heldout, rows, known[1], moved)
        if pooled is not None:
            return pooled
        texts = TextLookup(self.ws, self.chunks, verified=True)  # _positions checked them

        def fetch(wanted: np.ndarray) -> list[np.ndarray]:
            return fingerprint_rows(texts, self.spec, wanted)

        taus = self.thresholds
        spill = self.ws.home / "tmp"
        try:
            return search(
                self.blocks, heldout, rows, self.params, fetch, taus, known[0], moved, spill
            )
        finally:
            texts.release()  # the texts' pages, before the joins that follow


def _signatures(
    files: VerifiedFiles, chunk: ChunkRecords, digest: str, spec: SignatureSpec
) -> BandMajorFile:
    """A chunk's signatures read through ``files`` (hashed, or trusted while unchanged since
    they hashed right), checked for shape as ``load_signatures`` checks them."""
    what = f"MinHash signatures of chunk {chunk.key}"
    block = BandMajorFile.open(Path(files.path(digest, what)))
    if (block.num_perm, block.records) != (file_rows(spec), chunk.count):
        raise ValueError(
            f"{what} ({digest}) holds {block.num_perm} x {block.records} values, "
            f"expected {file_rows(spec)} x {chunk.count}"
        )
    return block


def _store_verified(
    con: duckdb.DuckDBPyConnection,
    digests: RowDigests,
    x: np.ndarray,
    y: np.ndarray,
    jaccard: np.ndarray,
) -> None:
    """The verified pairs of member rows as text-digest pairs (``ho_verified``). Each row
    named is read once, by ``digests`` (a chunk table's digest column at a time), and the pairs
    go in as numbers of those rows: both digests of every pair in Arrow were ~100 MB of a
    1.1 GB build's peak, and a DuckDB scan of every chunk table's digests for the rows named
    cost ~0.1 CPU-s more (a child's ~68k rows of ~690k)."""
    rows, ra, rb = distinct_rows(x.astype(np.int64), y.astype(np.int64))
    named = pa.table({"r": np.arange(len(rows)), "digest": digests.take(pa.array(rows))})
    pairs = pa.table({"ra": ra, "rb": rb, "jaccard": jaccard})
    with registered(con, "ho_estimated", pairs), registered(con, "ho_row_digests", named):
        con.execute(VERIFIED)


def put_verified(ws: Workspace, con: duckdb.DuckDBPyConnection) -> Ref:
    """The last search's verified pairs (``ho_verified``) stored, sorted: ``heldout_verified``."""
    sql = "SELECT a, b, jaccard FROM ho_verified ORDER BY a, b"
    ref, _ = put_query(ws.cas, con, sql, VERIFIED_COLUMNS, SORT_LIMIT)
    return ref
