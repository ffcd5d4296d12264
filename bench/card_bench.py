"""The CPU of drawing a dataset card's plots: ``render_plots(card)``, no plot cache, in a fresh
child process per repetition (so importing matplotlib counts, as in a build's manifest step),
for a named baseline checkout and this one, interleaved; medians, their ratio (and the median
of each repetition's pair: the load moves less within a pair), peak RSS.

Each child opens the workspace, loads the card (not timed), then times (CPU) importing
``card_plots`` and drawing every plot (the figure compared), then a second ``render_plots``
(drawing alone, for the record); it reports each plot's PNG digest and the digest of its
decoded RGB pixels. The script exits non-zero when a checkout's bytes differ between two of its
own runs (not deterministic) or when the two checkouts' decoded pixels differ.

Usage (a built snapshot: ``make demo`` prints ``snapshotId sha256:...``)::

    git worktree add --detach ../wt-base main
    .venv/bin/python bench/card_bench.py --base ../wt-base SNAPSHOT_ID [--reps 7]
        [--config .corpus/corpus.yaml]

Both run on this venv (the same matplotlib), each checkout first on ``PYTHONPATH``; both are
byte-compiled first, as ``make bytecode`` does for this one.
"""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def child(config: str, snapshot: str) -> None:
    """One measurement: print {cpu_s, peak_rss_mb, png, pixels} as JSON."""
    from corpus_assets.core.audit.card import load_card
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        card = load_card(ws.cas, ws.catalog, snapshot)
    start = time.process_time()
    from corpus_assets.core.audit.card_plots import render_plots

    plots = render_plots(card)
    cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.process_time()
    render_plots(card)  # drawing alone: matplotlib imported, fonts loaded
    again = time.process_time() - start
    assert len(plots) == 8 and all(p.startswith(PNG_MAGIC) for p in plots.values())
    got = {"cpu_s": cpu, "again_s": again, "peak_rss_mb": peak, "png": {}, "pixels": {}}
    for name, data in sorted(plots.items()):
        got["png"][name] = hashlib.sha256(data).hexdigest()[:16]
        got["pixels"][name] = _pixels_digest(data)
    print(json.dumps(got))


def _pixels_digest(data: bytes) -> str:
    """The decoded image as RGB, whatever the PNG's mode and compression."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    return hashlib.sha256(repr(image.size).encode() + image.tobytes()).hexdigest()[:16]


def run(checkout: Path, config: str, snapshot: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(HERE / "bench" / "card_bench.py"), "--child", config, snapshot]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", nargs="?")
    parser.add_argument("--base", type=Path, help="the baseline checkout")
    parser.add_argument("--config", default=".corpus/corpus.yaml")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    checkouts = {"base": args.base.resolve(), "new": HERE}
    for checkout in checkouts.values():  # both byte-compiled, as make bytecode does
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "corpus_assets")])
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for rep in range(args.reps):  # interleaved, each going first every other rep
        for name in sorted(checkouts, reverse=rep % 2 == 1):
            runs[name].append(run(checkouts[name], args.config, args.snapshot))
    return report(runs, os.getloadavg())


def report(runs: dict[str, list[dict]], load: tuple[float, ...]) -> int:
    print(f"{os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; medians")
    cpu = {name: statistics.median(r["cpu_s"] for r in rows) for name, rows in runs.items()}
    again = {name: statistics.median(r["again_s"] for r in rows) for name, rows in runs.items()}
    for name, rows in runs.items():
        every = " ".join(f"{r['cpu_s']:.2f}" for r in rows)
        peak = statistics.median(r["peak_rss_mb"] for r in rows)
        print(f"{name}: CPU-s {cpu[name]:.3f} ({every}), peak RSS {peak:.0f} MB", end="")
        print(f"; a second render_plots in the same child {again[name]:.3f}")
    ratio, drawing = cpu["new"] / cpu["base"], again["new"] / again["base"]
    pairs = [n["cpu_s"] / b["cpu_s"] for b, n in zip(runs["base"], runs["new"], strict=True)]
    print(f"new / base: {ratio:.3f} (the second render: {drawing:.3f}); ", end="")
    print(f"median of each rep's pair: {statistics.median(pairs):.3f}")
    wrong = [n for n, rows in runs.items() if any(r["png"] != rows[0]["png"] for r in rows)]
    for name in wrong:
        print(f"{name}: the same card gave different PNG bytes")
    base, new = runs["base"][0], runs["new"][0]
    moved = [plot for plot in base["pixels"] if base["pixels"][plot] != new["pixels"].get(plot)]
    same_bytes = base["png"] == new["png"]
    print(f"decoded pixels: {'differ in ' + ', '.join(moved) if moved else 'identical'}", end="")
    print(f"; PNG bytes: {'identical' if same_bytes else 'differ'}")
    return 1 if wrong or moved else 0


if __name__ == "__main__":
    sys.exit(main())
