"""Benchmark: resumable download into the CAS + streaming zstd JSONL lines, against curl | zstd.

Generates a zstd-compressed JSONL object, serves it from a loopback ThreadingHTTPServer and times,
interleaved in the same run, ``curl -s URL | zstd -d > /dev/null`` against child processes
(``download_child.py``, so each peak RSS is its own) making the production calls: "pin" is
``fetch_to_cas(validate=...)`` (what pinning calls: the object is decoded while it downloads);
the other rows are ``fetch_to_cas`` into a fresh CAS, then ``cas.open`` and either
``open_decompressed`` drained into nothing ("decode": the baseline's work plus the CAS and its
sha256 checks) or ``iter_located_lines`` (what the records layer calls). ``--before DIR`` also
times the code of an older checkout the same way (its rows but "pin"), in the same run.

    .venv/bin/python bench/download_bench.py --size-mb 100      # ~100 MB compressed, 5 reps
    .venv/bin/python bench/download_bench.py --big              # 1 GiB uncompressed, memory gate
"""

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import zstandard

REPO_ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().with_name("download_child.py")
MB = 1_000_000
BIG_UNCOMPRESSED = 1 << 30
BIG_PEAK_LIMIT_MB = 200
MODES = {
    "pin": "fetch_to_cas(validate=...): decoded while it downloads, as pinning does",
    "decode": "fetch_to_cas, then cas.open + open_decompressed into nothing",
    "lines": "fetch_to_cas, then cas.open + iter_located_lines",
}
NEW_MODES = {"pin"}
"""Modes older checkouts (``--before``) cannot run."""


def generate(path: Path, *, compressed_target: int | None, raw_target: int | None) -> dict:
    """Write deterministic JSONL through zstd level 3 until either target is reached."""
    rng = random.Random(20240601)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(alphabet, k=rng.randint(2, 11))) for _ in range(30_000)]
    raw = lines = 0
    with open(path, "wb") as sink:
        writer = zstandard.ZstdCompressor(level=3).stream_writer(sink, closefd=False)
        while True:
            batch = []
            for _ in range(2000):
                text = " ".join(rng.choices(words, k=rng.randint(20, 220)))
                batch.append(f'{{"id": {lines}, "source": "bench", "text": "{text}"}}\n')
                lines += 1
            data = "".join(batch).encode()
            writer.write(data)
            raw += len(data)
            if raw_target is not None and raw >= raw_target:
                break
            if compressed_target is not None and sink.tell() >= compressed_target:
                break
        writer.flush(zstandard.FLUSH_FRAME)
        writer.close()
    return {"lines": lines, "raw_bytes": raw, "compressed_bytes": path.stat().st_size}


class FileHandler(BaseHTTPRequestHandler):
    """Serves one file with Range support via sendfile; enough for curl and fetch_to_cas."""

    protocol_version = "HTTP/1.1"
    served: Path
    etag: str

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._respond(body=False)

    def do_GET(self) -> None:
        self._respond(body=True)

    def _respond(self, body: bool) -> None:
        size = self.served.stat().st_size
        start, end, status = 0, size - 1, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if match and self.headers.get("If-Range") in (None, self.etag):
            start = int(match[1])
            end = min(int(match[2]), end) if match[2] else end
            status = 206
        self.send_response(status)
        self.send_header("ETag", self.etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body:
            self.wfile.flush()
            with open(self.served, "rb") as handle:
                self.connection.sendfile(handle, start, end - start + 1)


def serve(path: Path) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Handler", (FileHandler,), {"served": path, "etag": '"bench-1"'})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/{path.name}"


def children_cpu() -> float:
    """User + system CPU seconds of every finished child (and theirs), all threads included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_baseline(url: str) -> tuple[float, float]:
    """(wall, CPU) seconds of ``curl | zstd -d`` (bash, curl and zstd)."""
    cpu = children_cpu()
    started = time.perf_counter()
    subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"curl -sf '{url}' | zstd -dq > /dev/null"], check=True
    )
    return time.perf_counter() - started, children_cpu() - cpu


def run_ours(url: str, scratch: Path, mode: str, tree: Path) -> tuple[float, dict]:
    """One child running ``tree``'s code (``--before`` runs an older checkout the same way)."""
    scratch.mkdir(parents=True)
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(CHILD), url, str(scratch), mode],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    wall = time.perf_counter() - started
    result = json.loads(done.stdout)
    result["cpu_s"] = children_cpu() - cpu
    shutil.rmtree(scratch)
    return wall, result


def prepare(obj: Path, big: bool, size_mb: float) -> dict:
    """Generate the object, or reuse one generated earlier with the same settings (``--object``)."""
    sidecar = obj.with_name(obj.name + ".json")
    wanted = {"big": big, "size_mb": None if big else size_mb}
    if sidecar.exists() and obj.exists():
        info = json.loads(sidecar.read_text())
        if info.get("settings") == wanted:
            return info
    started = time.perf_counter()
    if big:
        info = generate(obj, compressed_target=None, raw_target=BIG_UNCOMPRESSED)
    else:
        info = generate(obj, compressed_target=int(size_mb * MB), raw_target=None)
    with open(obj, "rb") as handle:
        info["digest"] = "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
    info["generated_s"] = time.perf_counter() - started
    info["settings"] = wanted
    sidecar.write_text(json.dumps(info))
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="compressed size (MB)")
    parser.add_argument("--big", action="store_true", help="1 GiB uncompressed; peak RSS gate")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (5; --big: 1)")
    parser.add_argument("--tmp", type=Path, default=None, help="scratch folder (default: $TMPDIR)")
    parser.add_argument("--object", type=Path, default=None, help="keep/reuse the object here")
    parser.add_argument(
        "--before", type=Path, default=None, help="also time this checkout's code (before rows)"
    )
    args = parser.parse_args()
    reps = args.reps or (1 if args.big else 5)
    trees = {"ours": REPO_ROOT} | ({"before": args.before.resolve()} if args.before else {})
    runs = [
        (f"{name} {mode}", mode, tree)
        for mode in MODES
        for name, tree in trees.items()
        if name == "ours" or mode not in NEW_MODES
    ]

    if args.tmp is not None:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="download-bench-") as tmp:
        root = Path(tmp)
        obj = args.object or root / "bench.jsonl.zst"
        info = prepare(obj, args.big, args.size_mb)
        print(
            f"object: {info['compressed_bytes'] / MB:.1f} MB zstd, {info['raw_bytes'] / MB:.1f} MB"
            f" JSONL, {info['lines']} lines (generated in {info['generated_s']:.1f} s)"
        )
        server, url = serve(obj)
        try:
            tools = [tool for tool in ("curl", "zstd") if shutil.which(tool) is None]
            baseline: list[float] = []
            baseline_cpu: list[float] = []
            if tools:
                print(f"baseline skipped: {' and '.join(tools)} not on PATH")
            walls: dict[str, list[float]] = {label: [] for label, _, _ in runs}
            details: dict[str, list[dict]] = {label: [] for label, _, _ in runs}
            for rep in range(reps):
                if not tools:
                    wall, cpu = run_baseline(url)
                    baseline.append(wall)
                    baseline_cpu.append(cpu)
                for label, mode, tree in runs:
                    wall, result = run_ours(url, root / f"rep-{rep}-{label}", mode, tree)
                    want = (info["digest"], info["raw_bytes"], info["lines"] * (mode == "lines"))
                    got = (result["digest"], result["decoded_bytes"], result["lines"])
                    if got != want:
                        print(f"WRONG RESULT from {label}: {result} (want {want})")
                        return 1
                    walls[label].append(wall)
                    details[label].append(result)
        finally:
            server.shutdown()
            server.server_close()

    report(info, (baseline, baseline_cpu), walls, details, reps)
    peak = max(result["peak_rss_mb"] for results in details.values() for result in results)
    if args.big:
        verdict = "PASS" if peak < BIG_PEAK_LIMIT_MB else "FAIL"
        print(f"{verdict}: peak RSS {peak:.1f} MB (limit {BIG_PEAK_LIMIT_MB} MB)")
        return 0 if verdict == "PASS" else 1
    return 0


def report(
    info: dict,
    baselines: tuple[list[float], list[float]],
    walls: dict[str, list[float]],
    details: dict[str, list[dict]],
    reps: int,
) -> None:
    compressed, raw = info["compressed_bytes"] / MB, info["raw_bytes"] / MB

    def line(name: str, seconds: float) -> str:
        return (
            f"{name:<15} median {seconds:7.3f} s   {compressed / seconds:8.1f} MB/s compressed"
            f"   {raw / seconds:8.1f} MB/s decompressed"
        )

    baseline, baseline_cpu = baselines
    print(f"medians of {reps} interleaved repetitions (MB = 10^6 bytes)")
    if baseline:
        base_median = statistics.median(baseline)
        base_cpu = statistics.median(baseline_cpu)
        print(line("baseline", base_median) + "   (curl -s URL | zstd -d > /dev/null)")
        print(f"  CPU (bash + curl + zstd, user + system): {base_cpu:.3f} s")
    for label, seconds in walls.items():
        mode = label.split()[-1]
        median = statistics.median(seconds)
        print(line(label, median) + f"   ({MODES[mode]}; child wall time incl. start-up)")
        download = statistics.median(result["download_s"] for result in details[label])
        decode = statistics.median(result["decode_s"] for result in details[label])
        peak = max(result["peak_rss_mb"] for result in details[label])
        cpu = statistics.median(result["cpu_s"] for result in details[label])
        parts = (
            f"fetch_to_cas decoding as it downloads {download:.3f} s"
            if mode in NEW_MODES
            else f"fetch_to_cas {download:.3f} s + {mode} {decode:.3f} s"
        )
        print(
            f"  inside the child: {parts},"
            f" peak RSS (VmHWM) {peak:.1f} MB, CPU (all threads) {cpu:.3f} s"
        )
        if baseline:
            print(
                f"  speed vs baseline: {base_median / median:.2f}x"
                f" (wall time {median / base_median:.2f}x;"
                f" CPU {cpu / base_cpu:.2f}x the baseline's)"
            )


if __name__ == "__main__":
    sys.exit(main())
