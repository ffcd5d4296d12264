"""Verification of a built snapshot: the first of the validity rules, and usable alone.

``verify`` recomputes every digest reachable from the manifest (the snapshotId itself, then each
CAS object by walking refs) and names every object that does not match. It needs no config;
``validation.validate_snapshot`` runs it and then every other rule, ``validation.verify_snapshot``
(``corpus-assets verify``) runs it and then the freeze-boundary rules (late CDC events).

With a ``StatTrust`` (the build's blocking check only) a table or shard whose file is unchanged
since it last hashed right is not read again (``storage.trust`` says what that does and does not
catch); JSON documents are always re-hashed, the walk reads them anyway. Without one - ``verify``
on the command line, approval, activation - every byte is hashed, as before.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from corpus_assets.core.governance import states
from corpus_assets.core.publication.identity import snapshot_id as compute_snapshot_id
from corpus_assets.core.publication.manifest_schema import schema_errors
from corpus_assets.core.publication.rules import RuleReport
from corpus_assets.core.publication.signing import SignatureError, check_alias_key, verify_signature
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest, ManifestError, MembersEntry
from corpus_assets.core.storage.artifacts import JSON, PARQUET, decode_json, get_json
from corpus_assets.core.storage.cas import COPY_CHUNK, CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.refs import BY_MEDIA, LEAF, TYPED, declared_refs, is_well_formed
from corpus_assets.core.storage.trust import StatTrust, file_stat

HASH_THREADS = min(4, os.cpu_count() or 1)  # objects re-hashed at once


@dataclass
class Report:
    """Findings (empty = valid) and what was checked; ``gate`` is filled by validation."""

    snapshot_id: str
    objects_checked: int = 0
    bytes_checked: int = 0
    findings: list[str] = field(default_factory=list)
    digests: set[str] = field(default_factory=set)
    verified: set[str] = field(default_factory=set)  # re-hashed and whole: no need to again
    objects_trusted: int = 0  # of objects_checked: unchanged files since they last hashed right
    rules_reused: list[str] = field(default_factory=list)  # filled by validation (gate_memo)
    rules_narrowed: list[str] = field(default_factory=list)  # run over a child's delta only
    parts_checked: dict[str, int] = field(default_factory=dict)  # rule -> members parts read
    gate: RuleReport = field(default_factory=RuleReport)

    @property
    def ok(self) -> bool:
        return not self.findings


def resolve(catalog: Catalog, digest: str) -> states.Snapshot:
    """A snapshot by its snapshotId, or by the CAS digest of its manifest document."""
    for snapshot in states.find(catalog):
        if digest in (snapshot.snapshot_id, snapshot.manifest_digest):
            return snapshot
    raise states.StateError(f"no snapshot with id or manifest digest {digest} in the catalog")


def load_manifest(cas: ContentStore, snapshot: states.Snapshot) -> Manifest:
    """The manifest, re-hashed by the CAS on read, as the typed model (``ManifestError`` when
    it does not fit; ``verify`` names why)."""
    return Manifest.read(stored_manifest(cas, snapshot), f"manifest {snapshot.manifest_digest}")


def stored_manifest(cas: ContentStore, snapshot: states.Snapshot) -> dict[str, Any]:
    """The manifest document as stored, for the checks of the stored bytes alone (snapshotId,
    schema, signature, the ref walk): they must name what is wrong with any document, which a
    model could not read. Every other reader takes ``load_manifest``."""
    return get_json(cas, snapshot.manifest_digest, "manifest")


def signed_manifest(
    cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot
) -> tuple[Manifest, str]:
    """The one door of every reader of a manifest's content (a permit, the training reader,
    the dataset card): the manifest re-hashed from the CAS, its snapshotId recomputed from its
    payload, and its DSSE signature by a key of the trust root (outside the home) that the
    catalog pins for the snapshot's alias; (manifest, key id). Raises ``SignatureError``."""
    document = stored_manifest(cas, snapshot)
    recomputed = compute_snapshot_id(document)
    sid = snapshot.snapshot_id
    if recomputed != sid or document.get("snapshotId") != sid:
        raise SignatureError(
            f"manifest {snapshot.manifest_digest} says snapshotId {document.get('snapshotId')}, "
            f"its payload hashes to {recomputed}, the catalog says {sid}"
        )
    keyid = verify_signature(document.get("signature"), sid, home=cas.root.parent)
    check_alias_key(catalog, snapshot.alias, sid, keyid)
    return Manifest.read(document, f"manifest {snapshot.manifest_digest}"), keyid


def verify(
    cas: ContentStore,
    catalog: Catalog,
    digest: str,
    public_key: Path | None = None,
    trust: StatTrust | None = None,
) -> Report:
    """Re-derive the snapshotId, check the schema and the signature (by ``public_key``, default
    any key of the trust root, which lives outside the data home), and re-hash every reachable
    object - but with ``trust``, not a table or shard whose file is unchanged since it last
    hashed right."""
    snapshot = resolve(catalog, digest)
    report = Report(snapshot.snapshot_id)
    try:
        manifest = stored_manifest(cas, snapshot)
    except CasError as error:
        report.findings.append(f"manifest: {error}")
        return report
    report.objects_checked += 1
    recomputed = compute_snapshot_id(manifest)
    if recomputed != manifest.get("snapshotId") or recomputed != snapshot.snapshot_id:
        report.findings.append(
            f"manifest {snapshot.manifest_digest}: snapshotId is {manifest.get('snapshotId')}, "
            f"catalog says {snapshot.snapshot_id}, payload hashes to {recomputed}"
        )
    report.findings += [f"manifest schema: {e}" for e in schema_errors(manifest)]
    try:
        keyid = verify_signature(
            manifest.get("signature"), recomputed, public_key=public_key, home=cas.root.parent
        )
        if public_key is None:  # an independent verifier's own key decides alone
            check_alias_key(catalog, snapshot.alias, snapshot.snapshot_id, keyid)
    except SignatureError as error:
        report.findings.append(f"manifest signature: {error}")
    report.digests.add(snapshot.manifest_digest)
    blobs: dict[str, tuple[dict[str, Any], str]] = {}
    _descend(cas, manifest, "manifest", report, seen=report.digests, blobs=blobs)
    _check_blobs(cas, blobs, report, trust)
    members = manifest.get("members", {})
    if report.ok and is_well_formed(members):
        report.findings += _member_counts(cas, MembersEntry.model_validate(members))
    if report.ok:
        report.findings += cluster_counts(cas, manifest.get("layers", {}).get("dedup_clusters"))
    return report


def _member_counts(cas: ContentStore, members: MembersEntry) -> list[str]:
    """The members' rows (in every part, each re-hashed by the walk) are the manifest's count."""
    if members.media == PARQUET:
        return _rows_are(cas, members.digest, members.count, "the manifest")
    try:
        parts = members.parts(cas)
    except ManifestError as error:
        return [str(error)]
    total = sum(part.count for part in parts.parts)
    if parts.count != members.count or total != members.count:
        return [
            f"members parts {members.digest}: its parts hold {total} rows, it says "
            f"{parts.count}, the manifest says {members.count}"
        ]
    said = f"members parts {members.digest}"
    return [f for p in parts.parts for f in _rows_are(cas, p.digest, p.count, said)]


def cluster_counts(cas: ContentStore, dedup: Any) -> list[str]:
    """Each dedup clusters part (re-hashed by the walk) holds the rows its document states:
    readers number the table's rows by those counts (``PartedTable``)."""
    if not is_well_formed(dedup):
        return []
    clusters = load_index(cas, dedup, "dedup_clusters").outputs.get("clusters")
    if not is_well_formed(clusters) or clusters["media"] != JSON:
        return []  # a table stored whole: no stated counts
    try:
        table = PartedTable.read(cas, clusters, "dedup clusters")
    except ManifestError as error:
        return [str(error)]
    said = f"dedup clusters parts {clusters['digest']}"
    return [f for p in table.parts for f in _rows_are(cas, p.digest, p.count, said, "clusters")]


def _rows_are(
    cas: ContentStore, digest: str, count: int, says: str, what: str = "members"
) -> list[str]:
    rows = pq.read_metadata(cas.path(digest)).num_rows
    return [] if rows == count else [f"{what} table {digest}: has {rows} rows, {says} says {count}"]


def reachable(
    cas: ContentStore, roots: list[dict[str, Any]], leaves: list[dict[str, Any]] | None = None
) -> tuple[set[str], list[str]]:
    """Every digest reachable from ``roots`` (refs to typed documents) by the walk ``verify``
    does - documents re-hashed and followed by their declared refs (``storage.refs``), opaque
    objects (tables, shards, tokenizer files: ``leaves`` too) named, not read - and its findings
    (a missing or corrupt document hides what it names: a caller deleting by this must refuse)."""
    report = Report("reachability")
    blobs: dict[str, tuple[dict[str, Any], str]] = {}
    for root in roots:
        where = f"root {root['digest']}"
        _walk(cas, root, TYPED, where, report, seen=report.digests, blobs=blobs)
    report.digests.update(leaf["digest"] for leaf in leaves or [])
    return report.digests, report.findings


def _rehash(cas: ContentStore, digest: str, media: str, what: str) -> tuple[int, Any]:
    """Stream the object through sha256 (CasError if missing or corrupt): its size, and its
    parsed document if ``media`` is JSON (a typed document the walk reads for its refs)."""
    if media == JSON:
        data = cas.get_bytes(digest, what)
        return len(data), decode_json(data)
    size = 0
    with cas.open(digest, what) as reader:
        while block := reader.read(COPY_CHUNK):
            size += len(block)
    return size, None


def _walk(
    cas: ContentStore,
    ref: dict[str, Any],
    target: str,
    where: str,
    report: Report,
    seen: set[str],
    blobs: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """Verify the typed document ``ref`` names and follow its declared refs; collect every
    opaque object (``LEAF``) in ``blobs`` with where it was first found, for ``_check_blobs``."""
    digest = ref["digest"]
    if digest in seen:
        return
    seen.add(digest)
    if target == BY_MEDIA:
        target = TYPED if ref["media"] == JSON else LEAF
    if target == LEAF:
        blobs[digest] = (ref, where)
        return
    if ref["media"] != JSON:
        report.findings.append(f"CAS object at {where} {digest}: a document, but {ref['media']}")
        return
    try:
        size, document = _rehash(cas, digest, JSON, f"object at {where}")
    except (CasError, ValueError) as error:
        report.findings.append(f"CAS object at {where} {digest}: {error}")
        return
    if _sized(report, ref, size, where):
        _descend(cas, document, where, report, seen, blobs)


def _descend(
    cas: ContentStore,
    document: Any,
    where: str,
    report: Report,
    seen: set[str],
    blobs: dict[str, tuple[dict[str, Any], str]],
) -> None:
    """Walk the refs a parsed typed document declares (its other fields are data)."""
    refs, findings = declared_refs(document)
    report.findings += [f"document at {where}: {finding}" for finding in findings]
    for path, child, target in refs:
        _walk(cas, child, target, f"{where}{path}", report, seen, blobs)


def _check_blobs(
    cas: ContentStore,
    blobs: dict[str, tuple[dict[str, Any], str]],
    report: Report,
    trust: StatTrust | None,
) -> None:
    """Re-hash every table and shard (a Parquet one must also have a readable footer), findings
    in walk order, ``HASH_THREADS`` objects at a time (sha256 releases the GIL: the hashing of
    gigabytes of shards and tables runs on every core); with ``trust``, those unchanged since
    they last hashed right are counted, not read, and those hashed now are recorded."""
    trusted = trust.unchanged(blobs) if trust is not None else set()
    todo = []
    for digest, (node, where) in blobs.items():
        if digest in trusted and cas.size(digest) == node["size"]:
            report.objects_checked += 1
            report.objects_trusted += 1
            report.verified.add(digest)
        else:
            todo.append((digest, node, where))
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        for (digest, node, where), (before, outcome) in zip(
            todo, pool.map(lambda item: _hash_blob(cas, *item), todo), strict=True
        ):
            if isinstance(outcome, CasError):
                report.findings.append(str(outcome))
            elif _sized(report, node, outcome, where) and trust is not None:
                trust.hashed(digest, before)
    if trust is not None:
        trust.flush()


def _hash_blob(
    cas: ContentStore, digest: str, node: dict[str, Any], where: str
) -> tuple[str | None, int | CasError]:
    """(the file's stat before reading, its size or why it failed) of one re-hashed blob."""
    before = file_stat(cas.local_path(digest))
    try:
        size, _ = _rehash(cas, digest, "opaque", f"object at {where}")  # never parsed here
        if node["media"] == PARQUET:
            pq.read_metadata(cas.path(digest))  # the footer: raises unless it is Parquet
    except CasError as error:
        return before, error
    return before, size


def _sized(report: Report, node: dict[str, Any], size: int, where: str) -> bool:
    """Count a re-hashed object; True (and ``verified``) if its size is the ref's."""
    digest = node["digest"]
    report.objects_checked += 1
    report.bytes_checked += size
    if size != node["size"]:
        report.findings.append(
            f"CAS object at {where} {digest}: {size} bytes, ref says {node['size']}"
        )
        return False
    report.verified.add(digest)
    return True
