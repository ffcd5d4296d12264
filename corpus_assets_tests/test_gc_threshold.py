"""Every process that imports the package collects its young generation every 10,000
allocations, not Python's 700 (``corpus_assets._gc``: ~16% of importing the definitions), unless
it chose its own threshold first. Each case runs in a fresh interpreter."""

import subprocess
import sys


def _thresholds(before: str) -> list[int]:
    probe = f"import gc; {before}; import corpus_assets.cli.main; print(*gc.get_threshold())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [int(n) for n in done.stdout.split()]


def test_importing_the_package_makes_young_collections_rarer() -> None:
    assert _thresholds("pass") == [10_000, 10, 10]


def test_a_process_that_chose_its_own_threshold_keeps_it() -> None:
    assert _thresholds("gc.set_threshold(500, 5, 5)") == [500, 5, 5]
