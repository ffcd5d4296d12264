"""Packages a process goes without: imports a library makes that nothing here uses.

- pyarrow imports pandas, when installed, at the first array or table a process builds, only to
  recognise pandas objects (~0.25 CPU-s). pandas is here through the ``hf`` extra and the dev
  group; no core task and no build step takes or returns a pandas object, so pool workers
  (``runtime.pool``) and every ``corpus-assets`` command's process go without it.
- securesystemslib's signer package imports boto3 for its AWS KMS signer (~0.15 CPU-s, every
  process that reads a manifest; secure-systems-lab/securesystemslib#1198), which is never used
  here: boto3 is hidden while that package loads (``hidden_while``), so its AWS signer records
  boto3 as missing, and is importable again right after (the S3 store imports it when used).
"""

import importlib.abc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Absent(importlib.abc.MetaPathFinder):
    """An import finder for which some top-level packages do not exist (ModuleNotFoundError)."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".", 1)[0] in self.names:
            raise ModuleNotFoundError(f"not imported in this process: {fullname}", name=fullname)


def go_without(*names: str) -> None:
    """From now on ``names`` cannot be imported in this process (unless already imported)."""
    missing = tuple(n for n in names if n not in sys.modules)
    if missing:
        sys.meta_path.insert(0, Absent(*missing))


@contextmanager
def hidden_while(*names: str) -> Iterator[None]:
    """``names`` cannot be imported inside the block (what is imported already stays)."""
    finder = Absent(*names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
