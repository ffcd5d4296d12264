"""+1% children of two checkouts, each over its own race home, interleaved: CPU of each build.

A race home (``bench/race.py --sizes N --tmp DIR`` leaves ``DIR/mbN``: sources, config, an
active parent) gets a new ~1% delta per run, copy K of the shared corpora (copy K rotates ASCII
letters by K mod 26; the 1.1 GB corpus holds copies 0-8 and the race's own delta copy 25, so new
text is K in 9-24), replacing the last delta, and ``corpus-assets build`` runs with that
checkout's Python. A copy whose letters the corpus already holds (K mod 26 among its copies), or
one built in that home before (listed in ``HOME/child_ab_copies``), is refused: its build would
be a child of duplicates, or an unchanged re-build, not a +1% child. Each child is +1% over the
same active parent (nothing is approved). The named baseline is the first checkout; medians of
the build's process-tree CPU (``wait4``).

    .venv/bin/python bench/child_ab.py --base CHECKOUT HOME --new CHECKOUT HOME --copies 11,12,13
"""

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import zstandard
from race_corpus import DELTAS, shared_bytes, write_delta

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def build(checkout: Path, home: Path) -> tuple[float, str]:
    """CPU-s of one ``corpus-assets build`` in ``home`` by ``checkout``'s Python; its snapshotId."""
    env = dict(os.environ, DAGSTER_HOME=str(home / "dagster"), CORPUS_HOME=str(home / "home"))
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), "-m", "corpus_assets.cli", "--config", str(home / "corpus.yaml"), "build"]
    proc = subprocess.Popen(cmd, env=env, cwd=checkout, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out[-2000:]}")
    sid = next((line.split()[1] for line in out.splitlines() if line.startswith("snapshotId")), "")
    return usage.ru_utime + usage.ru_stime, sid


def raw_bytes(src: Path) -> int:
    """The sources' decompressed bytes, the delta apart (what the race's 1% is of)."""
    total = 0
    for path in sorted(src.rglob("*.jsonl.zst")):
        if path.name in DELTAS:  # appended or sorting first
            continue
        with zstandard.ZstdDecompressor().stream_reader(path.open("rb")) as reader:
            while chunk := reader.read(1 << 22):
                total += len(chunk)
    return total


USED = "child_ab_copies"  # in each home: the copies built there, one a line


def check_copies(copies: list[int], homes: list[Path], corpora: Path) -> None:
    """Exit naming the first copy that would not make a +1% child of new text in every home."""
    per_copy = shared_bytes(corpora)  # the shared corpora decompressed: read once
    for home in homes:
        held = round(raw_bytes(home / "src") / per_copy)  # copies 0..held-1
        holds = f"copies 0-{held - 1}" if held > 1 else "copy 0"
        used_file = home / USED
        used = set(used_file.read_text().split()) if used_file.is_file() else set()
        for copy in copies:
            if copy % 26 < held or copy % 26 == 25:  # 25: the race's own +1% delta
                raise SystemExit(
                    f"copy {copy}: its letters are copy {copy % 26}'s, which {home} holds "
                    f"({holds} and the race's delta, 25); pick K with K mod 26 in "
                    f"{held}-24"
                )
            if str(copy) in used:
                raise SystemExit(f"copy {copy} was built in {home} before (see {used_file})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", nargs=2, type=Path, metavar=("CHECKOUT", "HOME"), required=True)
    parser.add_argument("--new", nargs=2, type=Path, metavar=("CHECKOUT", "HOME"), required=True)
    parser.add_argument("--copies", default="11,12,13")
    parser.add_argument("--corpora", type=Path, default=CORPORA)
    args = parser.parse_args()
    sides = {"base": args.base, "new": args.new}
    if args.base[1].resolve() == args.new[1].resolve():  # the second build would be a re-build
        raise SystemExit("--base and --new need a home each: a copy is built once in a home")
    copies = [int(c) for c in args.copies.split(",")]
    check_copies(copies, [args.base[1], args.new[1]], args.corpora)
    budget = raw_bytes(args.new[1] / "src") // 100
    cpu: dict[str, list[float]] = {"base": [], "new": []}
    for n, copy in enumerate(copies):
        for label in ("base", "new") if n % 2 == 0 else ("new", "base"):
            checkout, home = sides[label]
            write_delta(args.corpora, home / "src", copy, budget)
            start = time.perf_counter()
            seconds, sid = build(checkout.resolve(), home.resolve())
            with (home / USED).open("a") as used:
                used.write(f"{copy}\n")
            cpu[label].append(seconds)
            wall = time.perf_counter() - start
            print(f"{label} copy {copy}: {seconds:.2f} CPU-s, {wall:.1f} s wall, {sid[:23]}")
    base, new = (statistics.median(cpu[k]) for k in ("base", "new"))
    print(f"median CPU-s: base {base:.2f}, new {new:.2f}, new / base {new / base:.3f}")


if __name__ == "__main__":
    main()
