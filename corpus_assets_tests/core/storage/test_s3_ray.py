"""Shared corpora built on a real two-node Ray cluster with the CAS in S3 (a moto server process)
and the catalog in PostgreSQL: the snapshotId is the local build's.

Ray workers reopen the workspace from the config file (``storage.cas_url``) with the driver's
``CORPUS_*`` environment; the AWS settings (``AWS_ENDPOINT_URL``, credentials) reach them from the
environment the cluster was started with, as on a real cluster.
"""

import os
from pathlib import Path

import pytest

from corpus_assets.core.storage.cas_s3 import S3ContentStore
from corpus_assets_tests.core.runtime.test_ray import build_with_runner_pids, ray_cluster  # noqa: F401
from corpus_assets_tests.core.storage.test_s3_cas import bucket, moto_endpoint  # noqa: F401 - fixtures
from corpus_assets_tests.paths import CORPORA

CORPORA = Path(os.environ.get("CORPUS_TEST_CORPORA") or CORPORA)
SUBSET = {"licenses": "licenses", "pydocs": "python-docs", "chat": "chat-dialogs"}
CONFIG = """\
version: 1
purpose: shared-pretraining
alias: shared
sources:
{sources}
policies:
  splits: {{salt: shared-v1, train_percent: 80, validation_percent: 10, test_percent: 10}}
  mixing: {{seed: shared-mix-v1}}
  packing: {{block_tokens: 256}}
execution: {execution}
"""


def _build(
    home: Path, execution: str, storage: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, set[int]]:
    """snapshotId of a build of the subset, and the pids that ran its runner chunk tasks."""
    sources = "\n".join(
        f"  - {{id: {sid}, kind: objects, path: '{CORPORA / folder}'}}"
        for sid, folder in SUBSET.items()
    )
    home.mkdir(parents=True)
    (home / "corpus.yaml").write_text(CONFIG.format(sources=sources, execution=execution) + storage)
    results, pids = build_with_runner_pids(home, monkeypatch)
    return results["manifest"].digests["snapshotId"], pids


# 90-180 s here (two `ray start`s take 20-70 s on a busy 2-core machine): run with -m slow;
# the same deployment over the demo corpus (Ray + S3 CAS + PostgreSQL) runs in CI: test_ray.py
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.skipif(
    not all((CORPORA / f).is_dir() for f in SUBSET.values()),
    reason=f"the shared corpora ({', '.join(SUBSET.values())}) are absent under {CORPORA}",
)
def test_shared_corpora_on_ray_with_s3_cas_match_the_local_build(
    bucket: str,  # noqa: F811 - first: sets the AWS environment the Ray nodes inherit
    postgres_url: str,
    ray_cluster: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    local = _build(tmp_path / "local", "{engine: local}", "", monkeypatch)

    monkeypatch.setenv("CORPUS_CATALOG_URL", postgres_url)
    url = f"s3://{bucket}/shared"
    on_ray = _build(
        tmp_path / "ray",
        f"{{engine: ray, address: '{ray_cluster}'}}",
        f"storage: {{cas_url: '{url}'}}\n",
        monkeypatch,
    )
    assert on_ray[1] and os.getpid() not in on_ray[1]  # chunk tasks ran in Ray workers
    assert on_ray[0] == local[0]

    # what the Ray workers wrote is in the store: an empty cache reads it back, verified
    cache = tmp_path / "ray" / "cas"
    store = S3ContentStore(tmp_path / "empty-cache", url)
    stored = set(store.iter_digests())
    cached = {"sha256:" + p.name for p in (cache / "sha256").rglob("*") if p.is_file()}
    assert cached <= stored
    for digest in sorted(stored)[:20]:
        store.verify(digest)
