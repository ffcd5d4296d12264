"""What the gates read of one snapshot: small documents in memory, record tables through DuckDB.

The members table and the canonical rows hold one row per record, so the gates never load them
into Python: they are DuckDB views over the verified Parquet files (``members`` in table order
with ``file_row_number``, ``canonical`` over every chunk's records), and each gate asks one
query. Objects ``verify`` already re-hashed are read as they are; any other is
re-hashed (streamed) before its first read, so a corrupt table is still named.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.publication import manifest_queries
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import ChunkPart, Manifest
from corpus_assets.core.storage.artifacts import PARQUET, get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles, ordered_parts, sql_list
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.training_view.splits import EXCLUDED, UNLINKED

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


@dataclass
class Evidence:
    """What the gates read of one snapshot, loaded once and shared; ``close`` (or ``with``)
    drops the DuckDB connection and its spill directory."""

    cas: ContentStore
    catalog: Catalog
    manifest: Manifest
    freeze: FreezeSpec
    canonical: CanonicalIndex
    dedup: LayerIndex
    splits: LayerIndex
    files: VerifiedFiles
    narrowed: list[str] = field(default_factory=list)  # rules run over a child's delta only
    parts_checked: dict[str, int] = field(default_factory=dict)  # rule -> members parts read
    proven: dict[str, dict[str, Any]] = field(default_factory=dict)  # part outcomes to record
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _con: DuckDBPyConnection | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        cas: ContentStore,
        catalog: Catalog,
        manifest: Manifest,
        verified: set[str] | frozenset[str] = frozenset(),
    ) -> Evidence:
        """Read the freeze spec and the layer indexes, and check the members table is whole
        (CasError if any is missing or corrupt); ``verified`` digests are not re-hashed."""
        layers = manifest.layers
        files = VerifiedFiles(cas, verified)
        manifest.members.paths(files)
        return cls(
            cas=cas,
            catalog=catalog,
            manifest=manifest,
            freeze=FreezeSpec.load(cas, manifest.freeze),
            canonical=CanonicalIndex.load(cas, layers["canonical_records"]),
            dedup=load_index(cas, layers["dedup_clusters"], "dedup_clusters"),
            splits=load_index(cas, layers["splits"], "splits"),
            files=files,
        )

    def __enter__(self) -> Evidence:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the DuckDB connection, its cache and its spill directory (``con`` reopens)."""
        self._stack.close()
        self._con = None

    def evict(self) -> None:
        """Hand DuckDB's cached buffers back between rules, keeping every view and temp table:
        lowering its memory limit evicts them (temp tables move to its spill directory). At
        1.1 GB of raw text the rules before the held-out one left ~150 MB cached under its peak."""
        if self._con is None:
            return
        self._con.execute(f"SET memory_limit = '{manifest_queries.EVICT_MB}MB'")
        self._con.execute(f"SET memory_limit = '{manifest_queries.EVIDENCE_MB}MB'")

    @property
    def con(self) -> DuckDBPyConnection:
        """The connection, with the ``members`` view (``canonical_view`` adds ``canonical``)."""
        if self._con is None:
            self._con = self._open()
        return self._con

    def _open(self) -> DuckDBPyConnection:
        connection = manifest_queries.connect(
            self.cas, manifest_queries.EVIDENCE_THREADS, manifest_queries.EVIDENCE_MB
        )
        con = self._stack.enter_context(connection)
        members = self.manifest.members.paths(self.files)
        con.execute(f"CREATE VIEW members AS {ordered_parts(members, numbered=True)}")
        return con

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of a query over the views (callers keep results small: counts, examples)."""
        return self.con.execute(sql, params or []).fetchall()

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        return self.rows(sql, params)[0][0]

    def register(self, name: str, table: pa.Table) -> None:
        """A small Arrow table (pinned digests, quarantined ids) as a DuckDB relation."""
        self.con.register(name, table)

    @cached_property
    def member_count(self) -> int:
        """Rows of the members table, from its parts' footers."""
        paths = self.manifest.members.paths(self.files)
        return sum(pq.read_metadata(path).num_rows for path in paths)

    @cached_property
    def member_parts(self) -> list[ChunkPart] | None:
        """The members table's parts in order (None: one table, a manifest before parts)."""
        if self.manifest.members.media == PARQUET:
            return None
        return self.manifest.members.parts(self.cas).parts

    def clusters(self, numbered: bool = False) -> str:
        """The dedup clusters table as a DuckDB FROM item, its parts verified: one Parquet
        table or chunk parts (``PartedTable``), so no gate assumes the whole table is sorted
        by record id; with ``numbered``, ``file_row_number`` is a row's clusters position."""
        table = PartedTable.read(self.cas, self.dedup.output("clusters"), "dedup clusters")
        return table.relation(self.files, "dedup clusters", numbered)

    @cached_property
    def records_digests(self) -> set[str]:
        """The digests of every canonical chunk's records table (what ``canonical`` reads)."""
        return {chunk.records["digest"] for chunk in self.canonical.chunks()}

    @property
    def canonical_view(self) -> str:
        """The ``canonical`` view (record_id, object, line) over every chunk's records table,
        created on first use; returns its name."""
        if self.scalar("SELECT count(*) FROM duckdb_views() WHERE view_name = 'canonical'"):
            return "canonical"
        paths = [self.files.path(c.records["digest"], c.what) for c in self.canonical.chunks()]
        if not paths:
            self.con.execute(
                "CREATE VIEW canonical AS SELECT NULL::VARCHAR AS record_id, "
                "NULL::VARCHAR AS object, NULL::BIGINT AS line WHERE false"
            )
            return "canonical"
        self.con.execute(
            "CREATE VIEW canonical AS SELECT record_id, object, line "
            f"FROM read_parquet({sql_list(paths)})"
        )
        return "canonical"

    @cached_property
    def pinned(self) -> dict[str, str]:
        """Pinned object digest -> source id, in freeze order."""
        return {entry.sha256: source for source, entry in self.freeze.pinned()}

    @cached_property
    def split_conflicts(self) -> pa.Table:
        return get_table(self.cas, self.splits.output("split_conflicts"), "split conflicts")

    @cached_property
    def quarantined(self) -> list[str]:
        """Records a split conflict excluded (``split.bridge``): explained, never members."""
        return self._moved_to(EXCLUDED)

    @cached_property
    def unlinked(self) -> list[str]:
        """Removed newcomers a split conflict took out of the leakage graph (``bridge_copy``)."""
        return self._moved_to(UNLINKED)

    def _moved_to(self, where: str) -> list[str]:
        moves = get_table(self.cas, self.splits.output("split_moves"), "split moves")
        return moves.filter(pc.equal(moves.column("to"), where)).column("record_id").to_pylist()

    def table(self, ref: dict[str, Any], what: str, columns: list[str]) -> pa.Table:
        """Some columns of a verified table (re-hashed first unless verify did)."""
        return pq.read_table(self.files.path(ref["digest"], what), columns=columns)
