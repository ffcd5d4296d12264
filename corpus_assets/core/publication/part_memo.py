"""A rule's own passing outcome per members part, reused: a child checks only its new parts.

The members table is stored as parts (``member_parts``), and a child names its parent's part
for every chunk whose members are unchanged, so the two share those parts' digests. A rule that
is a property of each member row against its own chunk's records (lineage) holds for a part as
a function of the part's bytes, its chunk's records table and the rule's code alone; once it
held, it is recorded under the digest of exactly those (``part_key``: the part, the records
table, the rule's name and the transform image, every byte of the package) with what else the
outcome assumed (the objects the part's rows name, each pinned by the snapshot that is
checked). A later check of any snapshot naming the same part and records table reads that
record instead of the rows. Only the rule's own earlier outcome stands in: never a layer's
decisions table, and nothing that was not verified first (the files are read through
``VerifiedFiles``, which re-hashes or trusts only what hashed right).
"""

import json
from typing import Any

from sqlalchemy import select

from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.storage.catalog import Catalog, gate_results
from corpus_assets.core.storage.digests import json_digest

BATCH = 500  # keys a catalog query names at once (well under any bound-parameter limit)


def part_key(rule: str, part: ChunkPart) -> str:
    """Where ``rule``'s passing outcome over ``part`` (against its chunk's records) is kept."""
    return json_digest(
        {
            "rule": rule,
            "part": part.digest,
            "records": part.records,
            "image": transform_image(),
        }
    )


def recall(catalog: Catalog, keys: list[str]) -> dict[str, dict[str, Any]]:
    """key -> what was recorded with its passing outcome, for those of ``keys`` recorded."""
    found: dict[str, dict[str, Any]] = {}
    with catalog.begin() as conn:
        for at in range(0, len(keys), BATCH):
            query = select(gate_results.c.gate_key, gate_results.c.metrics).where(
                gate_results.c.gate_key.in_(keys[at : at + BATCH])
            )
            found.update({key: json.loads(metrics) for key, metrics in conn.execute(query)})
    return found


def remember(catalog: Catalog, key: str, manifest_digest: str, facts: dict[str, Any]) -> None:
    """Record a passing outcome under its key, with what it showed or assumed (``facts``); the
    first row for a key stays (same key, same outcome)."""
    catalog.insert_once(
        gate_results,
        gate_key=key,
        manifest_digest=manifest_digest,
        metrics=json.dumps(facts, sort_keys=True),
    )
