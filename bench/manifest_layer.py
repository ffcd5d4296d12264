"""CPU of the manifest layer of one partition (an incremental child's members table
and deletion index), the layers before it built first and not counted.

    .venv/bin/python bench/manifest_layer.py CONFIG PARTITION [--profile]

The partition is frozen, its six layers built, the parent's deletion index and narrowed
canonical chunks made (what a parent built by this code already has), then the manifest layer is
timed (process CPU, main process) and, with ``--profile``, its cumulative cProfile top printed.
Run against an older checkout (``PYTHONPATH``) it measures that code the same way.
"""

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.publication import narrowed as narrowing
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas_queries import VerifiedFiles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("partition")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with open_workspace(args.config) as ws, shared_pool():
        parents = freeze(ws, args.partition)[1].parents
        for layer in LAYERS[:-1]:
            BUILDERS[layer](ws, args.partition)
        for parent in parents:  # built by this code, as a parent published after it would be
            digest = states.get(ws.catalog, parent).manifest_digest
            deletion_index.ensure(ws.cas, ws.catalog, digest)
            _narrow(ws, digest)
        prof = cProfile.Profile()
        wall, cpu = time.perf_counter(), time.process_time()
        with prof if args.profile else _nothing():
            result = BUILDERS["manifest"](ws, args.partition)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"manifest layer: cpu {cpu:.2f} s, wall {wall:.2f} s")
        print({k: result.digests[k] for k in ("snapshotId", "members")})
        if args.profile:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
            print(out.getvalue()[-8000:])


def _narrow(ws: Workspace, manifest_digest: str) -> None:
    """The parent's canonical chunks narrowed and remembered, if this code does that."""
    ref = get_json(ws.cas, manifest_digest, "manifest")["layers"]["canonical_records"]
    with tempfile.TemporaryDirectory(dir=ws.home / "tmp") as tmp:
        narrowing.narrowed(ws, VerifiedFiles(ws.cas), CanonicalIndex.load(ws.cas, ref), Path(tmp))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


if __name__ == "__main__":
    main()
