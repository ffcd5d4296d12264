"""A near-duplicate pair dedup's LSH misses must not straddle two splits.

The attacker (or plain bad luck at the threshold edge) adds two essays at Jaccard just above the
threshold that no band of the dedup layer's LSH puts in one bucket and whose dedup keys hash to
two different splits (``selftest.leak_pair``). Built through the CLI as a new partition beside
the reference, the held-out search must find the pair and move one side
(``split.heldout_near``) so both records sit in one split, the snapshot must validate, and the
reference snapshot must be untouched.
"""

import json

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import states
from corpus_assets.core.runtime.config import NearDedupPolicy, SplitPolicy
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import PARTITION, Lab
from corpus_assets.selftest.leak_pair import find_leak_pair

IDS = ("leak/leak-a", "leak/leak-b")


@fault(
    "attack.7-missed-near-pair",
    "031",
    "two near-duplicate essays (J just above the threshold) that dedup's LSH misses and the "
    "split hash puts in two splits, added as a second source and built as a new partition",
    "the held-out search finds the pair and moves one side (split.heldout_near): both in one "
    "split, the snapshot VALIDATED; the reference snapshot's manifest intact",
    catalog=False,
)
def missed_near_pair(lab: Lab) -> Outcome:
    home, reference = lab.copy_of_reference("attack-leak")
    pair = find_leak_pair(SplitPolicy(), NearDedupPolicy())
    folder = home.dir / "leak-sources"
    folder.mkdir()
    rows = [{"id": rid.split("/")[1], "text": t} for rid, t in zip(IDS, pair.texts, strict=True)]
    (folder / "leak-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    home.configure(
        [
            {"id": "docs", "kind": "objects", "path": str(lab.standard_sources)},
            {"id": "leak", "kind": "objects", "path": str(folder)},
        ]
    )
    with workspace(home) as ws:
        before = states.get(ws.catalog, reference.snapshot_id).manifest_digest
    built = home.build("--partition", "p-leak")
    with workspace(home) as ws:
        _, index = read_layer_index(ws, built.partition, "splits")
        table = get_table(ws.cas, index.output("splits"), "splits")
        mine = table.filter(pc.is_in(table["record_id"], value_set=pa.array(IDS)))
        where = dict(zip(mine["record_id"].to_pylist(), mine["split"].to_pylist(), strict=True))
        moves = get_table(ws.cas, index.output("split_moves"), "moves")
        reasons = moves.filter(pc.is_in(moves["record_id"], value_set=pa.array(IDS)))
        reasons = reasons["reason"].to_pylist()
        signed = ws.catalog.layer_output(PARTITION, "manifest")
        kept = intact(ws, signed)
        after = states.get(ws.catalog, reference.snapshot_id).manifest_digest
    together = len(where) == 2 and len(set(where.values())) == 1
    return Outcome(
        observed=(
            f"J={pair.jaccard:.4f}, hashed to {pair.splits[0]}/{pair.splits[1]}; built "
            f"{built.state}; splits {[where.get(i) for i in IDS]}; moves {reasons}"
        ),
        matched=together and built.state == "VALIDATED" and reasons == ["split.heldout_near"],
        lost=NO_LOSS if kept else f"reference manifest {signed} damaged",
        digests_equal=before == after,
    )
