"""By-hand cross-check of ``export_mds`` against the real ``mosaicml-streaming`` (not a test).

mosaicml-streaming cannot live in the project environment: 0.13.0 pins ``numpy<2.2`` (the project
locks 2.4), ``import streaming`` imports ``streaming.vision`` (torchvision: PyPI's build does not
load beside the local CPU torch, "operator torchvision::nms does not exist") and
``streaming.text`` (transformers<5, which refuses the project's tokenizers 0.23.3 at import). So
this runs in two steps, the second in a scratch venv:

1. ``.venv/bin/python bench/mds_streaming_check.py export DIR`` writes a 230-block pack, exports
   it (``size_limit`` 20,000: 10 shards) and lays it out in ``DIR`` with ``expected.npz``.
2. In a scratch project (``requires-python = "==3.11.*"``, dependencies ``torch==2.13.0``,
   ``mosaicml-streaming==0.13.0``, ``[tool.uv] override-dependencies = ["numpy==2.4.6"]``,
   ``[tool.uv.sources] torch = { path = "/opt/wheels/torch-2.13.0+cpu-...whl" }``, then
   ``uv sync`` and ``uv pip uninstall torchvision``), run
   ``SCRATCH/.venv/bin/python bench/mds_streaming_check.py check DIR``: it reads every sample
   with ``StreamingDataset(local=DIR, validate_hash="sha256")``, compares them with the blocks,
   and rewrites them with ``MDSWriter`` (same columns, hashes, size limit) to compare the files
   byte for byte. ``streaming.vision`` is replaced by an empty module only so that the import
   gets past it; MDS reading and writing never use it.
"""

import sys
import tempfile
import types
from pathlib import Path

import numpy as np


def export(directory: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from corpus_assets.core.consumption.export_mds import export_mds, materialize_mds
    from corpus_assets.core.publication.block_reader import BlockReader
    from corpus_assets.core.storage.cas import ContentStore
    from corpus_assets_tests.core.storage.test_shards import make_blocks, write

    with tempfile.TemporaryDirectory() as scratch:
        cas = ContentStore(Path(scratch))
        blocks = make_blocks(230)
        _index, ref = write(cas, blocks, [230])
        reader = BlockReader.open(cas, ref["digest"])
        exported, export_ref = export_mds(cas, reader, ref["digest"], size_limit=20_000)
        materialize_mds(cas, exported, directory)
    np.savez(directory / "expected.npz", **blocks)
    print(f"exported {len(exported.shards)} shards to {directory}; document {export_ref['digest']}")


def check(directory: Path) -> None:
    sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")  # needs torchvision
    from streaming import MDSWriter, StreamingDataset

    expected = np.load(directory / "expected.npz")
    dataset = StreamingDataset(local=str(directory), shuffle=False, validate_hash="sha256")
    rows = [dataset[i] for i in range(len(dataset))]
    for name in expected.files:
        got = np.stack([row[name] for row in rows])
        if got.dtype != expected[name].dtype or not np.array_equal(got, expected[name]):
            raise SystemExit(f"FAIL: streaming read {name} differently")
    print(f"StreamingDataset read {len(rows)} samples equal to the blocks")
    index = __import__("json").loads((directory / "index.json").read_text())["shards"][0]
    columns = dict(zip(index["column_names"], index["column_encodings"], strict=True))
    out = Path(tempfile.mkdtemp()) / "mds"
    with MDSWriter(
        columns=columns, out=str(out), hashes=["sha256"], size_limit=index["size_limit"]
    ) as w:
        for row in rows:
            w.write(row)
    ours = sorted(p.name for p in directory.iterdir() if p.suffix in (".json", ".mds"))
    if ours != sorted(p.name for p in out.iterdir()) or any(
        (out / name).read_bytes() != (directory / name).read_bytes() for name in ours
    ):
        raise SystemExit("FAIL: MDSWriter wrote different files")
    print(f"MDSWriter wrote the same {len(ours)} files byte for byte")


if __name__ == "__main__":
    {"export": export, "check": check}[sys.argv[1]](Path(sys.argv[2]))
