"""The training view reads the dedup clusters table stored as chunk parts as it reads the table
stored whole: a real build's table is re-stored as parts whose record ids interleave (each part
sorted by record id, their concatenation not), its decisions' ``pos`` renumbered to positions in
that concatenation, and the splits, mixed samples and packed layers built again from it give the
same tables (digests and counts), for a first snapshot and for a child of one; the tokenizer's
train lines and ``explain`` agree too."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, build_all
from corpus_assets.core.runtime.layer_index import (
    LAYERS,
    LayerIndex,
    LayerResult,
    read_layer_index,
)
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
)
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table, put_json, put_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.training_view.tokenizer_fit import train_lines
from corpus_assets_tests.core.training_view.test_mixing_members import corpus_workspace
from corpus_assets_tests.core.training_view.test_packing_incremental import (  # noqa: F401 - autouse fixture
    _active,
    _add_essays,
    _home,
    _no_env_catalog,
)

PARTS = 3
VIEW = ("splits", "mixed_samples", "packed_blocks")


def _as_parts(ws: Workspace, dedup: LayerIndex) -> LayerIndex:
    """``dedup`` with its clusters table as ``PARTS`` parts and its decisions' positions
    renumbered to match. The rows are dealt to the parts by object and line, so that record ids
    interleave across parts (a real part holds one chunk's rows; the readers do not ask which,
    and the demo's record ids follow their objects)."""
    parted = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
    stored = parted.table(VerifiedFiles(ws.cas), "dedup clusters")
    keys = [(name, "ascending") for name in ("record_id", "object", "line")]
    order = pc.sort_indices(stored, sort_keys=keys).to_numpy()
    whole = stored.take(pa.array(order))  # in record order: each part dealt from it is too
    objects = {name: n for n, name in enumerate(sorted(set(whole["object"].to_pylist())))}
    where = zip(whole["object"].to_pylist(), whole["line"].to_pylist(), strict=True)
    part_of = np.array([(objects[name] + line) % PARTS for name, line in where])
    rows = [np.flatnonzero(part_of == k) for k in range(PARTS)]
    dealt = np.empty(whole.num_rows, dtype=np.int64)
    dealt[np.concatenate(rows)] = np.arange(whole.num_rows)
    moved = np.empty(whole.num_rows, dtype=np.int64)  # stored position -> position in parts
    moved[order] = dealt
    assert (moved != np.arange(whole.num_rows)).any()  # the positions change
    parts = []
    for k, taken in enumerate(rows):
        ref = put_table(ws.cas, whole.take(pa.array(taken)))
        parts.append(ChunkPart(chunk=f"c{k}", records=f"r{k}", count=len(taken), **ref))
    document = ChunkParts(
        schema=CLUSTER_PARTS_SCHEMA, code="test", count=whole.num_rows, parts=parts
    ).document()
    decisions = get_table(ws.cas, dedup.output("decisions"), "dedup decisions")
    pos = decisions["pos"].combine_chunks()
    valid = pc.is_valid(pos).to_numpy(zero_copy_only=False)
    renumbered = np.where(valid, moved[pc.fill_null(pos, 0).to_numpy()], 0)
    at = decisions.schema.get_field_index("pos")
    new_pos = pa.array(renumbered, pos.type, mask=~valid)
    decisions = decisions.set_column(at, decisions.schema.field(at), new_pos)
    outputs = {
        **dedup.outputs,
        "clusters": put_json(ws.cas, document),
        "decisions": put_table(ws.cas, decisions),
    }
    return dedup.model_copy(update={"outputs": outputs})


def _use(ws: Workspace, index: LayerIndex, key: str = "p1") -> None:
    """Point the partition's dedup layer at ``index`` (another spec: not a conflict)."""
    ref = put_json(ws.cas, index.document())
    spec = index.build_spec() + "+parts"
    ws.catalog.set_layer_output(key, "dedup_clusters", ref["digest"], spec)


def _rebuilt(ws: Workspace, key: str, built: dict[str, LayerResult]) -> None:
    """The view layers built again (from the dedup index the catalog now names) give the
    tables they gave."""
    for layer in VIEW:
        again = DIRECT_BUILDERS[layer](ws, key)
        assert again.digest != built[layer].digest, layer  # built again, from the parts
        assert again.digests == built[layer].digests, layer
        assert again.counts == built[layer].counts, layer


def _explained(ws: Workspace, dedup: LayerIndex, splits: LayerIndex, ids: list[str]) -> list[dict]:
    layers = {"dedup_clusters": put_json(ws.cas, dedup.document())}
    layers["splits"] = put_json(ws.cas, splits.document())
    manifest = SimpleNamespace(layers=layers, snapshot_id="p1")
    return [explain(ws.cas, manifest, record_id) for record_id in ids]  # type: ignore[arg-type]


def _some_ids(ws: Workspace, dedup: LayerIndex) -> list[str]:
    """A dozen record ids spread over the table (with every repeated one)."""
    parted = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
    ids = parted.table(VerifiedFiles(ws.cas), "dedup clusters", ["record_id"])
    names = ids["record_id"].to_pylist()
    repeated = {name for name in names if names.count(name) > 1}
    return sorted(set(names[:: max(1, len(names) // 12)]) | repeated)


@pytest.mark.parametrize("corpus", ["demo", "repeated_ids"])
def test_view_layers_from_clusters_parts_are_those_from_the_whole_table(
    corpus: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    ws = corpus_workspace(corpus, request, tmp_path)
    built = build_all(ws, "p1")
    _, dedup = read_layer_index(ws, "p1", "dedup_clusters")
    _, splits = read_layer_index(ws, "p1", "splits")
    lines = {name: sorted(rows.to_pylist()) for name, rows in train_lines(ws, "p1").items()}
    ids = _some_ids(ws, dedup)
    answers = _explained(ws, dedup, splits, ids)
    parted = _as_parts(ws, dedup)
    _use(ws, parted)
    _rebuilt(ws, "p1", built)
    got = {name: sorted(rows.to_pylist()) for name, rows in train_lines(ws, "p1").items()}
    assert got == lines
    assert _explained(ws, parted, splits, ids) == answers
    ws.close()


def test_a_childs_view_layers_from_clusters_parts_are_those_from_the_whole_table(
    tmp_path: Path,
) -> None:
    """With a parent: the splits inherited, the packing incremental (its sample map joins the
    clusters by position)."""
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        _add_essays(folder)
        built = {layer: BUILDERS[layer](ws, "p2") for layer in LAYERS[: LAYERS.index("manifest")]}
        _, dedup = read_layer_index(ws, "p2", "dedup_clusters")
        _use(ws, _as_parts(ws, dedup), "p2")
        _rebuilt(ws, "p2", built)
        _, packed = read_layer_index(ws, "p2", "packed_blocks")
    assert packed.outputs["packing"]["mode"] == "incremental"
