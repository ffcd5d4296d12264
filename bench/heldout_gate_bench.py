"""The held-out gate alone on a race root's child, as the build's check runs it on a child
whose parent passed it, though the root was built by other code: the parent's passing outcome
and the splits layer's code are taken as this code's (untimed set-up). Usage:

    .venv/bin/python bench/heldout_gate_bench.py DEST/corpus.yaml race-p1
"""

import json
import sys
import time

from corpus_assets.core.governance import states
from corpus_assets.core.publication import heldout_check
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.rules import RuleReport
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.trust import StatTrust


def main(config: str, partition: str) -> None:
    with open_workspace(config) as ws:
        digest = ws.catalog.layer_output(partition, "manifest")
        manifest = load_manifest(ws.cas, resolve(ws.catalog, digest))
        with Evidence.load(ws.cas, ws.catalog, manifest) as ev:
            # as the build's check: verify hashed the child's tables (``ev.files``), the
            # parent's check hashed the parent's (recorded; a staged copy's links moved ctime)
            ev.files.verified |= {c.records["digest"] for c in ev.canonical.chunks()}
            ours = PartedTable.read(ws.cas, ev.dedup.output("clusters"), "clusters")
            ev.files.verified |= {ref["digest"] for ref in ours.refs}
            parent = ev.freeze.parents[0]
            theirs = read_manifest(
                ws.cas, states.get(ws.catalog, parent).manifest_digest, "manifest"
            )
            dedup = load_index(ws.cas, theirs.layers["dedup_clusters"], "dedup_clusters")
            parts = [ref["digest"] for ref in theirs.members.part_refs(ws.cas)]
            theirs_clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "clusters")
            tables = [*parts, *(ref["digest"] for ref in theirs_clusters.refs)]
            StatTrust(ws.cas, ws.catalog).verify_all({d: "parent table" for d in tables})
            heldout_check._passed_parent = lambda *_: (theirs, dedup)  # type: ignore[assignment]
            heldout_check.SPLITS_CODE = ev.splits.code
            report = RuleReport()
            wall, cpu = time.perf_counter(), time.process_time()
            found = heldout_check.heldout_near_apart(ws)(ev, report)
            print(
                json.dumps(
                    {
                        "wall": time.perf_counter() - wall,
                        "cpu": time.process_time() - cpu,
                        "findings": len(found),
                        "narrowed": ev.narrowed,
                    }
                )
            )


if __name__ == "__main__":
    main(*sys.argv[1:3])
