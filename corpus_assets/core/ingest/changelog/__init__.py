"""CDC changelogs: Debezium-style event segments folded to the table state at a watermark.

The family's front: other packages import from here only. :mod:`.segments` lists segment files
and reads them bounded by that listing, :mod:`.events` parses and canonicalises one event line,
:mod:`.merge` streams every segment's events in lsn order and :mod:`.folding` folds them, reporting
gaps and late events.
"""

from corpus_assets.core.ingest.changelog.events import ChangelogError
from corpus_assets.core.ingest.changelog.folding import FoldResult, fold, late_events
from corpus_assets.core.ingest.changelog.segments import head_offset, list_segments

__all__ = ["ChangelogError", "FoldResult", "fold", "head_offset", "late_events", "list_segments"]
