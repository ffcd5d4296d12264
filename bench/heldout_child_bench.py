"""A +1% child's splits layer on a race root whose parent was built by other code (a baseline
checkout on ``PYTHONPATH``): the parent's stored search state and verified pairs are taken as
this code's, as they would be under the same code, so two checkouts' incremental layers compare
on one home. Prints the driver's CPU, its peak and the output digests (which must be equal).

    PYTHONPATH=CHECKOUT .venv/bin/python bench/heldout_child_bench.py DEST/corpus.yaml race-p1
"""

import json
import sys
import time

from corpus_assets.core.pipeline import DIRECT_BUILDERS, released
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.training_view.splits import build, heldout, heldout_state


def _own(index: LayerIndex | None, code: str) -> str:
    """The code a stored splits index must have: its own (else ``code``)."""
    return index.code if index is not None else code


def main(config: str, partition: str) -> None:
    build.prior_search = lambda ws, scan, parent, code, policy: heldout_state.prior_search(  # type: ignore[assignment]
        ws, scan, parent, _own(parent[0], code), policy
    )
    build.reuse = lambda ws, dedup, spec, s: heldout.reuse(  # type: ignore[assignment]
        ws, dedup, spec, (s[0], _own(s[0], s[1]), s[2])
    )
    with open_workspace(config) as ws:
        cpu = time.process_time()
        result = released(DIRECT_BUILDERS["splits"])(ws, partition)
        search = result.details["heldout_search"]
        with open("/proc/self/status") as fh:
            hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
        print(
            json.dumps(
                {
                    "cpu": time.process_time() - cpu,
                    "peak_mb": hwm / 1024,
                    "state": search.get("state"),
                    "candidates": search.get("candidates"),
                    "digests": result.digests,
                }
            )
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
