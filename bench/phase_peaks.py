"""RSS high-water mark of each named phase of one layer, with no sampling thread.

The layer is rebuilt as ``race.py --child --direct`` does. Each named function is wrapped: the
kernel's high-water mark (``VmHWM``) is read and reset (``/proc/self/clear_refs`` 5) when it
starts and when it returns, so each line is the peak of one phase or of the gap before it.
``peak_where.py``'s sampler inflated the peaks it watched (see its docstring); this reads the
same figure ``race.py`` quotes (the cost line printed first is ``race.py``'s, but its peak is
only the last stretch's once the marks were reset). Linux only. Phases are
``module:attribute.path`` under ``corpus_assets.core``; a nested phase resets its outer phase's
mark, so name siblings.

    DAGSTER_HOME=H/dagster CORPUS_HOME=H/home .venv/bin/python bench/phase_peaks.py \\
        H/corpus.yaml splits training_view.splits.build:resolve_heldout \\
        training_view.splits.heldout_resolve:_numbered [--identity-as CHECKOUT]
"""

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import race  # bench/ is not a package: its folder is put on the path first


def _reset() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the high-water mark back to the current RSS


class Marks:
    """Each checkpoint's label and the high-water mark since the one before."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def checkpoint(self, label: str) -> None:
        self.seen.append((label, race._vm_kb("VmHWM") / 1024))
        _reset()

    def wrapped(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def phase(*args: Any, **kwargs: Any) -> Any:
            self.checkpoint(f"  (before {name})")
            try:
                return fn(*args, **kwargs)
            finally:
                self.checkpoint(name)

        return phase


def _wrap(marks: Marks, phase: str) -> None:
    module, path = phase.split(":")
    owner: Any = importlib.import_module(f"corpus_assets.core.{module}")
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    setattr(owner, name, marks.wrapped(path, getattr(owner, name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("layer")
    parser.add_argument("phases", nargs="+", help="module:attribute under corpus_assets.core")
    parser.add_argument("--partition", default="race-p1")
    parser.add_argument("--identity-as", type=Path, help="as race.py --identity-as")
    args = parser.parse_args()
    if args.identity_as:
        as_if = race._identity_as(args.identity_as)
        if as_if is not None:  # the shim loads at start-up: run again under it
            os.execve(sys.executable, [sys.executable, *sys.argv], as_if)
    marks = Marks()
    for phase in args.phases:
        _wrap(marks, phase)
    _reset()
    race.child(args.config, args.partition, args.layer, direct=True)
    marks.checkpoint("(after the last phase)")
    for label, mb in marks.seen:
        print(f"{label:44} {mb:7.1f} MB")


if __name__ == "__main__":
    main()
