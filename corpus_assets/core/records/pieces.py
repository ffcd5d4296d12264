"""An object's canonical records written as pieces of at most ``PIECE_GROUPS`` row groups.

Every later stage runs a task per records table (signatures, tokens, members, shards), and its
arrays grow with the table's rows: one table an object made a task's memory, and the layer's
parallelism, a function of the largest object a source holds. The pieces cut where the row
groups end (65,536 rows or 32 MB of text, see ``kept``), so the cut is a function of the
object's records alone, never of the worker count or the engine.
"""

import pyarrow as pa

from corpus_assets.core.records.index import PIECE_GROUPS, ChunkPiece
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.parquet_sink import TableWriter


class PiecedWriter:
    """A sink for whole row groups (one ``write_table`` a group) that starts a new table in
    the store after every ``groups`` of them; ``close`` gives the pieces (at least one, maybe
    empty)."""

    def __init__(self, cas: ContentStore, schema: pa.Schema, groups: int | None = None) -> None:
        self._cas, self._schema = cas, schema
        self._groups = groups if groups is not None else PIECE_GROUPS
        self._writer: TableWriter | None = None
        self._written = 0  # row groups in the open piece
        self.pieces: list[ChunkPiece] = []

    def write_table(self, group: pa.Table) -> None:
        if self._writer is None:
            self._writer = TableWriter(self._cas, self._schema)
        self._writer.write_table(group)
        self._written += 1
        if self._written == self._groups:
            self._close_piece()

    def _close_piece(self) -> None:
        writer = self._writer if self._writer is not None else TableWriter(self._cas, self._schema)
        self._writer, self._written = None, 0
        self.pieces.append(ChunkPiece(records=writer.close(), count=writer.rows))

    def close(self) -> list[ChunkPiece]:
        """The pieces in order: the open one closed, or one empty table if none was written."""
        if self._writer is not None or not self.pieces:
            self._close_piece()
        return self.pieces

    def abort(self) -> None:
        """Drop the open piece's partial file (the closed pieces are whole objects in the
        store, collected like any unnamed object)."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
