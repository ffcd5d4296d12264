"""``collect_cycles``: survivors are frozen so the next collection walks only younger objects, and
a garbage cycle among frozen objects is still freed, by the full collection that runs once the
frozen heap has doubled. Run in a fresh interpreter: the collector's state is per process."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, weakref
    from corpus_assets.core.storage.memory import collect_cycles

    class Node:
        pass

    collect_cycles()  # the first call is a full collection; the heap is frozen after it
    frozen_heap = gc.get_freeze_count()
    assert frozen_heap > 10_000, frozen_heap
    node = Node()
    node.self = node  # a cycle: only the collector frees it
    ref = weakref.ref(node)
    collect_cycles()  # alive here: frozen with the other survivors
    del node
    collect_cycles()
    assert ref() is not None  # frozen garbage waits for the next full collection...
    keep = [[] for _ in range(2 * frozen_heap)]  # ...which runs once the frozen heap doubled
    calls = 0
    while ref() is not None and calls < 3:
        collect_cycles()
        calls += 1
    assert ref() is None, "a frozen garbage cycle was never freed"
    print(calls)
    """
)


def test_a_cycle_frozen_while_alive_is_freed_once_the_frozen_heap_has_doubled() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in {"1", "2"}  # the call that froze ``keep``, or the next


# A DuckDB connection that ran a large sort, then the call under test; the process's RSS (MB)
# after the sort and after the call. Its freed pages stay with DuckDB's allocator (measured:
# ~380 MB of 2M rows still resident 3 s later) unless handed back.
DUCKDB_SCRIPT = textwrap.dedent(
    """
    import numpy as np, pyarrow as pa
    from corpus_assets.core.storage import cas_queries
    from corpus_assets.core.storage.memory import hand_back_duckdb
    from corpus_assets.core.training_view.splits.heldout_known import known_jaccards

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024

    con = cas_queries.connect("512MB", 2)
    con.execute(
        "CREATE TEMP TABLE t AS SELECT i, repeat('x', 60) || i::VARCHAR AS s "
        "FROM range(800000) r(i) ORDER BY s DESC"
    )
    con.execute("DROP TABLE t")
    after_sort = rss()
    if CALL == "hand_back":
        hand_back_duckdb(con)
    else:  # a lookup of two pairs in a table of known Jaccards
        con.execute("CREATE TEMP TABLE known AS SELECT 'p' AS a, 'q' AS b, 0.5 AS jaccard")
        digests = pa.array(["p", "q", "r"])
        found = known_jaccards(con, ("known",), digests, np.array([0, 0]), np.array([1, 2]))
        assert found[0] == 0.5 and np.isnan(found[1]), found
    print(after_sort, rss())
    """
)


@pytest.mark.parametrize("call", ["hand_back", "known_jaccards"])
def test_a_duckdb_connections_freed_pages_are_handed_back(call: str) -> None:
    """``hand_back_duckdb`` returns what DuckDB's allocator kept, and the held-out search's
    Jaccard lookup calls it (its join's pages sat under the fingerprinting after it)."""
    script = f"CALL = {call!r}\n" + DUCKDB_SCRIPT
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]  # after any progress bar DuckDB printed
    after_sort, after_call = map(int, last.split()[-2:])
    assert after_sort - after_call > 80, (after_sort, after_call)


STARTUP_SCRIPT = textwrap.dedent(
    """
    import gc, weakref
    import corpus_assets.core.pipeline  # a start-up heap: ~100k objects
    from corpus_assets.core.storage import memory

    class Node:
        pass

    def cycle():
        node = Node()
        node.self = node  # only the collector frees it
        return node

    unfrozen = []
    real_unfreeze = gc.unfreeze
    memory.gc.unfreeze = lambda: (unfrozen.append(1), real_unfreeze())[1]
    node = cycle()
    gc.collect()  # an old survivor...
    old = weakref.ref(node)
    del node  # ...that start-up left as garbage
    memory.freeze_startup_heap()
    startup = gc.get_freeze_count()
    assert startup > 50_000, startup
    memory.freeze_startup_heap()  # once per process
    assert gc.get_freeze_count() == startup
    young = weakref.ref(cycle())  # garbage of the run
    memory.collect_cycles()
    assert young() is None, "a cycle made after start-up was not freed"
    assert not unfrozen, "the first collection walked the start-up heap"
    assert old() is not None  # start-up garbage waits for a full collection...
    keep = [[] for _ in range(2 * startup)]  # ...which runs once the frozen heap doubled
    for _ in range(3):
        memory.collect_cycles()
    assert unfrozen and old() is None, "start-up garbage was never freed"
    """
)


def test_the_start_up_heap_is_frozen_without_a_full_collection() -> None:
    """A build's first ``collect_cycles`` after ``freeze_startup_heap`` walks only what was
    made since (no unfreeze: no full collection over the ~200k objects of start-up), still
    frees the run's garbage cycles, and start-up garbage goes at the doubling rule's full one."""
    done = subprocess.run([sys.executable, "-c", STARTUP_SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


DEFERRED_SCRIPT = textwrap.dedent(
    """
    import gc, sys
    from corpus_assets.cli import main
    from corpus_assets.cli.commands import snapshots
    from corpus_assets.core.storage import memory

    seen = {}
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(phase))

    def build(partition):
        seen["during start-up"] = gc.isenabled()
        before = len(collections)
        junk = [[] for _ in range(50_000)]  # start-up's allocations: no collection runs
        seen["collections"] = len(collections) - before
        memory.freeze_startup_heap()  # as cli.runs.build does before the run
        seen["after the freeze"] = gc.isenabled()
        seen["frozen"] = gc.get_freeze_count()
        seen["collections after"] = len(collections) - before
        raise SystemExit(0)

    snapshots.build = build
    try:
        main.main(["--config", sys.argv[1], "build", "--partition", "p1"], console=True)
    except SystemExit:
        pass
    assert seen["during start-up"] is False, seen
    assert seen["collections"] == 0, seen
    assert seen["after the freeze"] is True, seen
    assert seen["frozen"] > 50_000, seen
    assert seen["collections after"] == 0, seen  # frozen as it was: nothing walked it
    """
)


def test_the_cli_build_defers_collections_until_the_start_up_heap_is_frozen(
    tmp_path: Path,
) -> None:
    """``corpus-assets build`` (the console script) collects no garbage while it starts (its
    imports, Dagster's definitions and instance: young collections walked that heap again and
    again), then freezes it as it is before the run's first layer and collects as usual."""
    config = tmp_path / "corpus.yaml"
    config.write_text("version: 1\n")
    done = subprocess.run(
        [sys.executable, "-c", DEFERRED_SCRIPT, str(config)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
