"""One snapshot's tables as record lineage reads them: a few rows each, never a whole table.

Every path handed out is a verified CAS file (``TrustedFiles``: re-hashed once, or trusted while
its stat is the one recorded when it last hashed right). Members, splits and dedup rows are found
by record id, canonical rows by line within their object's chunk, packed spans by block and mixed
samples by position - the keys those tables are sorted by (``storage.table_lookup``); the blocks
holding a record come from the snapshot's deletion index (its ``span/<record id>`` rows).
"""

from functools import cached_property
from typing import Any

from sqlalchemy import select

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.publication.verify import load_manifest
from corpus_assets.core.records.index import RECORD_COLUMNS, CanonicalIndex, ChunkEntry
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, permits
from corpus_assets.core.storage.table_lookup import SortedTable, TrustedFiles, matching_rows

CANONICAL_COLUMNS = [f.name for f in RECORD_COLUMNS if f.name not in ("payload", "text")]
MEMBER_COLUMNS = ["source_id", "object", "line", "record_digest", "group_id", "split"]
SPAN_COLUMNS = ["block", "start", "end", "record_id", "record_offset", "sample", "shard"]
SAMPLE_COLUMNS = ["position", "record_id", "source_id", "repeat", "weight"]


class SnapshotTables:
    """A snapshot's manifest, layer indexes, freeze and table files, each read once."""

    def __init__(self, cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot) -> None:
        self.cas, self.catalog, self.snapshot = cas, catalog, snapshot
        self.manifest = load_manifest(cas, snapshot)
        self.files = TrustedFiles(cas, catalog)
        self._indexes: dict[str, LayerIndex] = {}

    def head(self) -> dict[str, Any]:
        """What names the snapshot in every answer."""
        return {
            "snapshotId": self.snapshot.snapshot_id,
            "manifest": self.snapshot.manifest_digest,
            "partition": self.snapshot.partition_key,
        }

    def index(self, layer: str) -> LayerIndex:
        if layer not in self._indexes:
            self._indexes[layer] = load_index(self.cas, self.manifest.layers[layer], layer)
        return self._indexes[layer]

    def path(self, layer: str, output: str, what: str) -> str:
        return self.files.path(self.index(layer).output(output)["digest"], what)

    @cached_property
    def freeze(self) -> FreezeSpec:
        return FreezeSpec.load(self.cas, self.manifest.freeze)

    @cached_property
    def canonical(self) -> CanonicalIndex:
        return CanonicalIndex(self.cas, self.index("canonical_records"))

    @cached_property
    def shard_index(self) -> dict[str, Any]:
        """The packed shards' index document: each shard's digest, first block and blocks."""
        ref = self.index("packed_blocks").output("shard_index")
        return get_json(self.cas, ref, "shard index")

    @cached_property
    def shards(self) -> list[str]:
        return [ref["digest"] for ref in self.index("packed_blocks").outputs.get("shards", [])]

    def member(self, record_id: str) -> dict[str, Any] | None:
        """The record's members row."""
        rows = self.members([record_id])
        return rows.get(record_id)

    def members(self, record_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The members rows of ``record_ids`` (each part is sorted by record id; of a record id
        on two rows, the last in part order, as a dict built from the table would hold)."""
        found: dict[str, dict[str, Any]] = {}
        for path in self.manifest.members.paths(self.files):
            with SortedTable(path, "record_id") as table:
                for row in table.rows(record_ids, MEMBER_COLUMNS).to_pylist():
                    found[row["record_id"]] = row
        return found

    def chunk_names(self, source_id: str, digest: str) -> list[str]:
        """Names under which the source pinned these bytes (one, unless copies were listed)."""
        return [e.name for s, e in self.freeze.pinned() if s == source_id and e.sha256 == digest]

    def canonical_rows(
        self, source_id: str, digest: str, lines: list[int], record_ids: set[str] | None = None
    ) -> list[dict[str, Any]]:
        """The canonical rows at ``lines`` of the object (by line within each of its records
        pieces, each in line order), without payload and text; only ``record_ids``' when
        given."""
        entries = {entry.chunk: entry for entry in self.canonical.entries}
        found = []
        for name in self.chunk_names(source_id, digest):
            entry: ChunkEntry | None = entries.get(f"{source_id}/{name}")
            if entry is None:
                continue
            rows, what = [], f"records of {entry.chunk}"
            for piece in self.canonical.descriptor(entry).parts():
                with SortedTable(self.files.path(piece.records["digest"], what), "line") as table:
                    rows += table.rows(lines, CANONICAL_COLUMNS).to_pylist()
            found += [
                {**row, "name": name}
                for row in rows
                if record_ids is None or row["record_id"] in record_ids
            ]
        return found

    def samples_of(self, record_ids: list[str]) -> list[dict[str, Any]]:
        """Every mixed sample of these records, by position (a scan of two narrow columns)."""
        path = self.path("mixed_samples", "samples", "mixed samples")
        rows = matching_rows(path, "record_id", record_ids, SAMPLE_COLUMNS)
        return sorted(rows.to_pylist(), key=lambda r: r["position"])

    def samples_at(self, positions: list[int]) -> dict[int, dict[str, Any]]:
        """Mixed samples by stream position (the table is in position order)."""
        path = self.path("mixed_samples", "samples", "mixed samples")
        with SortedTable(path, "position") as table:
            rows = table.rows(positions, SAMPLE_COLUMNS).to_pylist()
        return {row["position"]: row for row in rows}

    def spans_of(self, record_ids: list[str]) -> list[dict[str, Any]]:
        """Every packed span of these records: the deletion index names their blocks, the spans
        table (in block order) gives the rows with their sample."""
        index = deletion_index.for_snapshot(self.cas, self.catalog, self.snapshot.manifest_digest)
        located = index.rows([deletion_index.span_key(r) for r in record_ids])
        blocks = sorted(set(located.column("block").to_pylist()))
        if not blocks:
            return []
        path = self.path("packed_blocks", "spans", "spans table")
        with SortedTable(path, "block") as table:
            rows = table.rows(blocks, SPAN_COLUMNS).to_pylist()
        wanted = set(record_ids)
        return [self.span(row) for row in rows if row["record_id"] in wanted]

    def spans_between(self, first: int, last: int) -> list[dict[str, Any]]:
        """Every span of blocks ``first`` to ``last`` (inclusive), in block order."""
        path = self.path("packed_blocks", "spans", "spans table")
        with SortedTable(path, "block") as table:
            rows = table.between(first, last, SPAN_COLUMNS).to_pylist()
        return [self.span(row) for row in rows]

    def span(self, row: dict[str, Any]) -> dict[str, Any]:
        """A spans row with its shard named by CAS digest and by position."""
        position = row.pop("shard", None)  # an index written before shards has none
        shard = self.shards[position] if position is not None else None
        return {**row, "shard_index": position, "shard": shard}

    def runs(self) -> list[dict[str, Any]]:
        """The training runs whose permits name this snapshot, oldest first."""
        columns = ["run_id", "purpose", "permit_id", "alias", "generation", "at"]
        with self.catalog.begin() as conn:
            rows = conn.execute(
                select(*(permits.c[c] for c in columns))
                .where(permits.c.snapshot_id == self.snapshot.snapshot_id)
                .order_by(permits.c.at, permits.c.run_id)
            ).all()
        return [dict(zip(columns, row, strict=True)) for row in rows]
