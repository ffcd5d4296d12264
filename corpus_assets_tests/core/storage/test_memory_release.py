"""``collect_cycles``: survivors are frozen so the next collection walks only younger objects, and
a garbage cycle among frozen objects is still freed, by the full collection that runs once the
frozen heap has doubled. Run in a fresh interpreter: the collector's state is per process."""

import subprocess
import sys
import textwrap

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
