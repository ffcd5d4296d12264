"""One measured run of ``download_bench.py``: the production calls, in a fresh process.

Kept apart from the bench so the process imports only what a build imports for these calls (the
bench's HTTP server, statistics and generator would add start-up time that is not ours).

    python bench/download_child.py URL SCRATCH MODE   # prints one JSON line
"""

import json
import re
import sys
import time
from collections import deque
from pathlib import Path

from corpus_assets.core.ingest.codecs import DEFAULT_LIMITS, iter_located_lines, open_decompressed
from corpus_assets.core.ingest.download import fetch_to_cas
from corpus_assets.core.storage.cas import ContentStore

MB = 1_000_000


def run(url: str, scratch: Path, mode: str) -> dict:
    """What pinning then the records layer do: ``fetch_to_cas`` into a fresh CAS, then
    ``cas.open`` and, for ``mode`` "lines", ``iter_located_lines`` (the records layer's call);
    for "decode", ``open_decompressed`` read into one reused buffer and dropped. "pin" is what
    pinning calls now: ``fetch_to_cas(validate=...)``, decoding while it downloads; no read."""
    cas = ContentStore(scratch / "cas")
    started = time.perf_counter()
    if mode == "pin":  # not passed otherwise: --before runs this child on older code
        fetched = fetch_to_cas(url, cas, scratch / "work", validate=DEFAULT_LIMITS)
    else:
        fetched = fetch_to_cas(url, cas, scratch / "work")
    downloaded = time.perf_counter()
    lines = decoded = 0
    if mode == "pin":
        decoded = fetched.decoded_bytes or 0
    else:
        lines, decoded = _read(cas, fetched.digest, mode)
    finished = time.perf_counter()
    status = Path("/proc/self/status").read_text()
    peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status)[1])  # type: ignore[index]
    return {
        "digest": fetched.digest,
        "lines": lines,
        "decoded_bytes": decoded,
        "download_s": downloaded - started,
        "decode_s": finished - downloaded,
        "peak_rss_mb": peak_kb * 1024 / MB,
    }


def _read(cas: ContentStore, digest: str, mode: str) -> tuple[int, int]:
    """(lines, decoded bytes) read back from the CAS, as the records layer does later."""
    lines = decoded = 0
    with cas.open(digest, "bench object") as stream:
        if mode == "lines":
            last = deque(iter_located_lines(stream, "bench object"), maxlen=1)  # C-level drain
            if last:
                lines, offset, line = last[0]
                decoded = offset + len(line) + 1
        else:
            reader = open_decompressed(stream, "bench object")
            buffer = memoryview(bytearray(1 << 20))
            while count := reader.readinto(buffer):
                decoded += count
    return lines, decoded


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], Path(sys.argv[2]), sys.argv[3])))
