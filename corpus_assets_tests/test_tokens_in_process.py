"""A few small chunks to tokenise run in the layer's own process, even with workers: a child's
new chunks cost less here than the spawn workers' start (their imports). The bytes are the
pool's."""

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.storage.tasks import WORKER
from corpus_assets.core.tokens.cache import LAYER, ensure_tokens
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets_tests.conftest import use_demo_copy


def _owners(ws: Workspace) -> list[str]:
    """The process that tokenised each chunk (the task row's owner)."""
    with ws.catalog.begin() as conn:
        rows = conn.execute(select(chunk_tasks.c.owner).where(chunk_tasks.c.layer == LAYER))
        return [row.owner for row in rows]


@pytest.mark.parametrize("in_process_bytes", [None, 0])
def test_small_missing_chunks_are_tokenised_here_with_the_pools_bytes(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process_bytes: int | None
) -> None:
    digests = []
    for n, (workers, bound) in enumerate([(1, None), (2, in_process_bytes)]):
        use_demo_copy(demo_home, tmp_path / f"h{n}", workers, monkeypatch)
        with open_workspace(Path(os.environ["CORPUS_CONFIG"])) as ws:
            for layer in ("raw_snapshot", "canonical_records"):
                BUILDERS[layer](ws, "p1")
            chunks = CanonicalIndex.read(ws, "p1")[1].chunks()
            spec = resolve_tokenizer(ws)
            if bound is None:  # the default bound: the demo's four small chunks stay here
                cached = ensure_tokens(ws, chunks, spec, workers)
            else:
                cached = ensure_tokens(ws, chunks, spec, workers, in_process_bytes=bound)
            assert all(c.tokenized for c in cached) and len(cached) == 4
            owners = _owners(ws)
            assert len(owners) == 4
            here = workers == 1 or bound is None
            assert all(owner == WORKER for owner in owners) == here, owners
            assert any(owner == WORKER for owner in owners) == here, owners
            digests.append([c.digest for c in cached])
    assert digests[0] == digests[1]
