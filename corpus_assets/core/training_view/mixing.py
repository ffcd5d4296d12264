"""mixed_samples: the training stream drawn from the train split.

With alpha = 1 (natural proportions, unit = documents) every train record is used exactly once, so
the target share of each source equals its document share. The order is a seeded hash shuffle -
sort by sha256(seed NUL record_id), ties by record_id - so it depends on the seed and the member
set, never on worker count or completion order.
"""

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import LayerResult, publish_table_layer, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.training_view.splits import TRAIN

CODE = stage_code("mixed_samples.natural.v1", __name__)  # its closure, hashed at import
MIX_COLUMNS = pa.schema(
    [("position", pa.int64()), ("record_id", pa.string()), ("source_id", pa.string())]
)


def build_mixed_samples(ws: Workspace, partition_key: str) -> LayerResult:
    splits_ref, splits = read_layer_index(ws, partition_key, "splits")
    table = get_table(ws.cas, splits.output("splits"), "splits table")
    train = table.filter(pc.equal(table.column("split"), TRAIN)).column("record_id").to_pylist()
    seed = ws.config.policies.mixing.seed.encode()
    ordered = sorted(
        train, key=lambda rid: (hashlib.sha256(seed + b"\x00" + rid.encode()).digest(), rid)
    )
    sources = [rid.split("/", 1)[0] for rid in ordered]
    mixed = pa.Table.from_pydict(
        {"position": list(range(len(ordered))), "record_id": ordered, "source_id": sources},
        schema=MIX_COLUMNS,
    )
    counts = {"samples": mixed.num_rows}
    counts.update({f"source.{s.id}": sources.count(s.id) for s in ws.config.sources})
    return publish_table_layer(
        ws,
        partition_key,
        layer="mixed_samples",
        code=CODE,
        policy="mixing",
        inputs=[splits_ref],
        name="samples",
        table=mixed,
        counts=counts,
    )
