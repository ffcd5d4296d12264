"""Shadow diff: what approving a candidate would change against the alias's active snapshot.

Reviewers approve a digest; this tells them what that digest means relative to what training
reads today: members added and removed, records that migrated between splits, and distribution
shifts (share of each source and split, byte-length quantiles).
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import gate
from corpus_assets.core.release.verify import load_manifest, resolve
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog

QUANTILES = (0.1, 0.5, 0.9, 0.99)


def _members(cas: ContentStore, manifest: dict[str, Any]) -> pa.Table:
    columns = ["record_id", "source_id", "split", "text_bytes"]
    return get_table(cas, manifest["members"], "members table", columns)


def _profile(members: pa.Table) -> dict[str, Any]:
    total = max(members.num_rows, 1)
    shares: dict[str, dict[str, str]] = {}
    for column in ("source_id", "split"):
        counts = pc.value_counts(members.column(column)).to_pylist()
        shares[column] = {
            c["values"]: f"{100 * c['counts'] / total:.2f}%"
            for c in sorted(counts, key=lambda c: c["values"])
        }
    lengths = members.column("text_bytes")
    quantiles = (
        pc.quantile(lengths, q=list(QUANTILES), interpolation="nearest").to_pylist()
        if members.num_rows
        else [0] * len(QUANTILES)
    )
    return {
        "members": members.num_rows,
        "source_share": shares["source_id"],
        "split_share": shares["split"],
        "text_bytes_quantiles": {
            f"p{int(q * 100)}": v for q, v in zip(QUANTILES, quantiles, strict=True)
        },
    }


def shadow_diff(cas: ContentStore, catalog: Catalog, digest: str) -> dict[str, Any]:
    """Candidate vs the active snapshot of its alias (or vs nothing, for the first one)."""
    candidate = resolve(catalog, digest)
    new = _members(cas, load_manifest(cas, candidate))
    active_id = gate.read_gate(catalog, candidate.alias).active_snapshot
    diff: dict[str, Any] = {"candidate": candidate.snapshot_id, "active": active_id}
    diff["candidate_profile"] = _profile(new)
    if active_id is None or active_id == candidate.snapshot_id:
        diff.update(added=new.num_rows, removed=0, split_migrations=0, examples={})
        return diff
    old = _members(cas, load_manifest(cas, resolve(catalog, active_id)))
    old_split = dict(
        zip(old.column("record_id").to_pylist(), old.column("split").to_pylist(), strict=True)
    )
    new_split = dict(
        zip(new.column("record_id").to_pylist(), new.column("split").to_pylist(), strict=True)
    )
    added = sorted(set(new_split) - set(old_split))
    removed = sorted(set(old_split) - set(new_split))
    migrated = sorted(r for r in set(new_split) & set(old_split) if new_split[r] != old_split[r])
    diff.update(
        added=len(added),
        removed=len(removed),
        split_migrations=len(migrated),
        active_profile=_profile(old),
        examples={
            "added": added[:5],
            "removed": removed[:5],
            "migrated": [f"{r}: {old_split[r]} -> {new_split[r]}" for r in migrated[:5]],
        },
    )
    return diff
