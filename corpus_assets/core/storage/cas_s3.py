"""The content-addressed store in an S3-API object store, with the local store as its cache.

``storage.cas_url: s3://bucket/prefix`` (or ``CORPUS_CAS_URL``) keeps every object at
``<prefix>/sha256/ab/cd/<hex>``, the local layout. Readers keep using ``cas.path(digest)`` (mmap,
pread, pyarrow): a local miss downloads the object to a temp file, hashes it and links it into
place only if it matches, so nothing corrupt ever lands in the cache. A put uploads first, with
``If-None-Match: *`` (a 412 means another writer won: the object is there, counted as reused),
then links locally; so every object in the cache is also in the store, and a node with an empty
cache reads everything back from the store.

Library: boto3, the AWS SDK itself: it has the conditional-write parameter (``IfNoneMatch``) on
``put_object`` and ``complete_multipart_upload``, standard retries, and reads the standard
configuration (credentials, region, ``AWS_ENDPOINT_URL`` for MinIO/moto/other S3-API servers).
It is imported lazily (the optional extra ``corpus-assets[s3]``).

Credentials come from that standard configuration, or from the URL itself
(``s3://KEY:SECRET@bucket/prefix``, the secret percent-encoded if it holds ``@``): such a URL is
only ever shown masked (``storage.url_secrets``), and the cache marker records the store without
them.
"""

import base64
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from corpus_assets.core.storage.cas import (
    COPY_CHUNK,
    CasError,
    ContentStore,
    CorruptObjectError,
    MissingObjectError,
)
from corpus_assets.core.storage.digests import PREFIX, check_digest, hasher_digest, hex_of
from corpus_assets.core.storage.fsio import atomic_write, link_into_place, write_temp
from corpus_assets.core.storage.url_secrets import masked

CAS_URL_RE = re.compile(
    r"^s3://(?:(?P<key>[^:/@\s]+):(?P<secret>[^@\s]+)@)?"
    r"(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$"
)
HEX_NAME = re.compile(r"^[0-9a-f]{64}$")
MARKER = "cache-of"  # in the cache root: the store URL this directory caches
PRECONDITION_FAILED = ("PreconditionFailed", "412")
CONFLICT = ("ConditionalRequestConflict", "409")
NOT_FOUND = ("NoSuchKey", "404", "NotFound")
OBJECT_KEY = re.compile(r"^sha256/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})$")  # under the prefix
GC_LOG = "gc-log/"  # under the prefix: what each gc removed, one digest a line (see forget_removed)
LOG_NAME = re.compile(r"^[0-9]{12}$")  # a gc log's name: its sequence number
SEEN = "gc-log-seen"  # in the cache root: the last gc log this cache has applied


def parse_cas_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``; a ``ValueError`` names what is wrong."""
    match = _matched(url)
    return match["bucket"], (match["prefix"] or "").strip("/")


def _matched(url: str) -> re.Match[str]:
    match = CAS_URL_RE.match(url)
    if not match:
        raise ValueError(
            f"cas_url {masked(repr(url))} must look like s3://bucket or s3://bucket/prefix"
        )
    return match


def cas_credentials(url: str) -> dict[str, str]:
    """boto3 session arguments for the key and secret written in ``url`` (none: empty)."""
    match = _matched(url)
    if not match["key"]:
        return {}
    return {
        "aws_access_key_id": unquote(match["key"]),
        "aws_secret_access_key": unquote(match["secret"]),
    }


def store_name(url: str) -> str:
    """``s3://bucket/prefix``: which store ``url`` names, without its credentials."""
    bucket, prefix = parse_cas_url(url)
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def open_content_store(root: Path, cas_url: str | None = None) -> ContentStore:
    """The local store at ``root``, or with ``cas_url`` the object store cached at ``root``."""
    return S3ContentStore(root, cas_url) if cas_url else ContentStore(root)


def _named(found: str) -> str:
    """The store a cache marker names (older markers hold the URL as configured)."""
    try:
        return store_name(found)
    except ValueError:
        return found


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


class S3ContentStore(ContentStore):
    """``ContentStore`` whose objects live in S3; ``root`` is a read-through cache of them."""

    # single PUT up to this size (S3 allows 5 GiB), multipart above; tests lower both
    multipart_bytes = 1 << 30
    part_bytes = 64 << 20
    delete_batch = 1000  # keys per DeleteObjects call, the S3 maximum; tests lower it

    def __init__(self, root: Path, cas_url: str) -> None:
        super().__init__(root)
        self.url = cas_url  # may hold credentials: messages use ``self.name``
        self.bucket, prefix = parse_cas_url(cas_url)
        self.name = store_name(cas_url)
        self.prefix = f"{prefix}/" if prefix else ""
        self._known: set[str] = set()  # digests this process saw in the store
        self._s3: Any = None
        self._pid = 0
        self._claim_cache()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_s3": None}  # a boto3 client is per process

    def close(self) -> None:
        """Close this process's client (its connection pool); the next request makes another."""
        if self._s3 is not None and self._pid == os.getpid():
            self._s3.close()
        self._s3 = None

    def _claim_cache(self) -> None:
        """Refuse a local directory that holds objects written without this store: the rule
        'every cached object is in the store' would not hold for them."""
        marker, objects = self.root / MARKER, self.root / "sha256"
        if not marker.is_file():
            # a cache's marker is written before its first object: look again after the objects
            local = objects.is_dir() and any(objects.iterdir())
            if local and not marker.is_file():
                raise CasError(
                    f"{self.root} holds objects of a local CAS; it cannot become the cache of "
                    f"{self.name} (set storage.home to another directory, or empty {objects})"
                )
            if not marker.is_file():
                self.root.mkdir(parents=True, exist_ok=True)
                atomic_write(marker, (self.name + "\n").encode())
        found = masked(marker.read_text().strip())  # a marker written before names were kept
        if _named(found) != self.name:
            raise CasError(f"{self.root} is the CAS cache of {found}, not of {self.name}")

    def _client(self) -> Any:
        if self._s3 is None or self._pid != os.getpid():
            try:
                import boto3
                from botocore.config import Config
            except ImportError:  # pragma: no cover - depends on the installed extras
                raise CasError(
                    f"storage.cas_url is {self.name} but boto3 is not installed: "
                    "pip install 'corpus-assets[s3]'"
                ) from None
            config = Config(retries={"mode": "standard", "max_attempts": 5})
            session = boto3.session.Session(**cas_credentials(self.url))
            client = session.client("s3", config=config)
            self._check_bucket(client)
            self._s3, self._pid = client, os.getpid()
        return self._s3

    def _check_bucket(self, client: Any) -> None:
        """The store never creates its bucket (owner, region and policies are the operator's
        choice): a missing one is named, with how to create it, before the first request."""
        from botocore.exceptions import ClientError

        try:
            client.head_bucket(Bucket=self.bucket)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise
            raise CasError(
                f"storage.cas_url {self.name}: bucket {self.bucket!r} does not exist; the CAS "
                f"never creates it: create it first, e.g. `aws s3 mb s3://{self.bucket}` "
                "(with --endpoint-url for a non-AWS server such as MinIO)"
            ) from None

    def key(self, digest: str) -> str:
        hexd = hex_of(digest)
        return f"{self.prefix}sha256/{hexd[:2]}/{hexd[2:4]}/{hexd}"

    def location(self, digest: str) -> str:
        """Where the object is in the store (``uri`` stays ``cas://``: manifests hold it)."""
        return f"s3://{self.bucket}/{self.key(digest)}"

    def _head(self, digest: str) -> int | None:
        """The object's size in the store, or None if it is not there."""
        from botocore.exceptions import ClientError

        try:
            head = self._client().head_object(Bucket=self.bucket, Key=self.key(digest))
        except ClientError as error:
            if _code(error) in NOT_FOUND:
                return None
            raise
        self._known.add(digest)
        return int(head["ContentLength"])

    def contains(self, digest: str) -> bool:
        return super().contains(digest) or self._head(digest) is not None

    def size(self, digest: str) -> int:
        local = self.local_path(digest)
        if local.is_file():
            return local.stat().st_size
        size = self._head(digest)
        if size is None:
            raise MissingObjectError(digest)
        return size

    def path(self, digest: str) -> Path:
        """The cached file, downloaded and verified first if it is not cached yet."""
        target = self.local_path(digest)
        if not target.is_file():
            self._fetch(digest, target)
        return target

    def _fetch(self, digest: str, target: Path) -> None:
        """Download into a temp file while hashing; link it into the cache only if it matches.
        An object missing from the store leaves ``target`` absent (callers report it)."""
        from botocore.exceptions import ClientError

        try:
            body = self._client().get_object(Bucket=self.bucket, Key=self.key(digest))["Body"]
        except ClientError as error:
            if _code(error) in NOT_FOUND:
                return
            raise
        hasher = hashlib.sha256()

        def chunks() -> Iterator[bytes]:
            for block in body.iter_chunks(COPY_CHUNK):
                hasher.update(block)
                yield block

        try:
            temp = write_temp(self._tmp, chunks())
        finally:
            body.close()
        actual = hasher_digest(hasher)
        if actual != digest:
            temp.unlink(missing_ok=True)
            raise CorruptObjectError(digest, actual, f"object at {self.location(digest)}")
        self._known.add(digest)
        link_into_place(temp, target)

    def _publish(self, temp: Path, digest: str) -> bool:
        """Upload (put-if-absent), then link into the cache: cache implies store."""
        try:
            created = self._upload(temp, digest)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        super()._publish(temp, digest)
        return created

    def _upload(self, temp: Path, digest: str) -> bool:
        """Conditionally write ``temp`` at the object's key; False if it was there already.
        A 409 (another conditional write of the key in flight) is retried."""
        from botocore.exceptions import ClientError

        if digest in self._known:
            return False
        for attempt in range(6):
            try:
                if temp.stat().st_size <= self.multipart_bytes:
                    self._put_single(temp, digest)
                else:
                    self._put_parts(temp, digest)
            except ClientError as error:
                if _code(error) in PRECONDITION_FAILED:
                    self._known.add(digest)
                    return False
                if _code(error) not in CONFLICT or attempt == 5:
                    raise
                time.sleep(0.1 * 2**attempt)
            else:
                self._known.add(digest)
                return True
        raise AssertionError("unreachable")  # pragma: no cover

    def _put_single(self, temp: Path, digest: str) -> None:
        # S3 checks the body against this sha256 and rejects a mismatch (moto does not)
        checksum = base64.b64encode(bytes.fromhex(hex_of(digest))).decode()
        with open(temp, "rb") as body:
            self._client().put_object(
                Bucket=self.bucket,
                Key=self.key(digest),
                Body=body,
                IfNoneMatch="*",
                ChecksumSHA256=checksum,
            )

    def _put_parts(self, temp: Path, digest: str) -> None:
        """Multipart upload, made visible only by a conditional complete (or aborted)."""
        s3, key = self._client(), self.key(digest)
        upload = s3.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            with open(temp, "rb") as handle:
                while block := handle.read(self.part_bytes):
                    number = len(parts) + 1
                    etag = s3.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=block
                    )["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
            s3.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
        except BaseException:
            s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            raise

    def iter_digests(self) -> Iterator[str]:
        """Every object in the store (the cache holds a subset of them)."""
        pages = self._client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}sha256/"):
            for item in page.get("Contents", []):
                name = item["Key"].rsplit("/", 1)[-1]
                if HEX_NAME.match(name):
                    yield PREFIX + name

    def listing(self) -> Iterator[tuple[str | None, str, int]]:
        """(digest, key, bytes) of every key under the store's prefix, from the listing itself
        (no HEAD per object), in key order; the digest is None for a key that is not an object
        at its place (gc reports those, never removes). The gc log is the store's own: skipped."""
        pages = self._client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", []):
                key, rest = item["Key"], item["Key"][len(self.prefix) :]
                if rest.startswith(GC_LOG):
                    continue
                match = OBJECT_KEY.match(rest)
                ok = match and match[3][:2] == match[1] and match[3][2:4] == match[2]
                yield (PREFIX + match[3] if ok else None), key, int(item["Size"])

    def remove(self, digests: list[str]) -> None:
        """Delete objects (gc, under the exclusive CAS lock): each batch's cached copies first,
        then the batch from the store, so a crash leaves no cached object the store lost."""
        for start in range(0, len(digests), self.delete_batch):
            batch = digests[start : start + self.delete_batch]
            for digest in batch:
                self.local_path(digest).unlink(missing_ok=True)
                self._known.discard(digest)
            keys = [{"Key": self.key(d)} for d in batch]
            done = self._client().delete_objects(
                Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True}
            )
            failed = [f"{e['Key']} ({e.get('Code')})" for e in done.get("Errors", [])]
            if failed:
                raise CasError(f"{self.name}: could not delete {len(failed)} objects: {failed[:5]}")

    def _gc_logs(self, after: str = "") -> list[str]:
        base = self.prefix + GC_LOG
        pages = self._client().get_paginator("list_objects_v2")
        start = {"StartAfter": base + after} if after else {}
        found = pages.paginate(Bucket=self.bucket, Prefix=base, **start)
        names = (item["Key"][len(base) :] for page in found for item in page.get("Contents", []))
        return [name for name in names if LOG_NAME.match(name)]

    def record_removal(self, digests: list[str]) -> str:
        """Before gc removes ``digests``, log them in the store as the next gc log: every node's
        cache drops them on its next CAS lock (``forget_removed``). Returns the log's name."""
        logs = self._gc_logs()
        name = f"{int(logs[-1]) + 1 if logs else 1:012d}"
        temp = write_temp(self._tmp, (d.encode() + b"\n" for d in digests))
        try:
            with open(temp, "rb") as body:
                self._client().put_object(
                    Bucket=self.bucket, Key=self.prefix + GC_LOG + name, Body=body, IfNoneMatch="*"
                )
        finally:
            temp.unlink(missing_ok=True)
        return name

    def forget_removed(self) -> int:
        """Drop from this cache every object a gc removed since the cache last looked (call
        under the CAS lock): a cached copy would otherwise pass ``contains`` and ``path`` here,
        and a build would name an object the store no longer has. Returns how many it dropped."""
        seen_file = self.root / SEEN
        seen = seen_file.read_text().strip() if seen_file.is_file() else ""
        logs = self._gc_logs(seen)
        objects = self.root / "sha256"
        if logs and not seen and not (objects.is_dir() and any(objects.iterdir())):
            logs = logs[-1:]  # an empty cache holds nothing any log names: start at the newest
            atomic_write(seen_file, (logs[0] + "\n").encode())
            return 0
        dropped = 0
        for name in logs:
            key = self.prefix + GC_LOG + name
            body = self._client().get_object(Bucket=self.bucket, Key=key)["Body"]
            for line in body.iter_lines():
                digest = line.decode().strip()
                try:
                    check_digest(digest)
                except ValueError:
                    raise CasError(f"gc log s3://{self.bucket}/{key}: bad line {line!r}") from None
                try:
                    self.local_path(digest).unlink()
                    dropped += 1
                except FileNotFoundError:
                    pass
            atomic_write(seen_file, (name + "\n").encode())
        return dropped
