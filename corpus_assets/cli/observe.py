"""A state move made on the command line shows in the UI at once: around the move the CLI
writes the same observations a run writes (``assets.lifecycle.observing``) straight to the
Dagster instance, when there is one."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from corpus_assets.cli.instance import existing_instance

if TYPE_CHECKING:
    from corpus_assets.core.runtime.workspace import Storage


@contextmanager
def observed(home: "Storage", alias: str) -> Iterator[None]:
    """Observe ``alias`` and every snapshot of it whose standing the body changed."""
    instance = existing_instance()
    if instance is None:
        yield
        return
    from corpus_assets.assets.lifecycle import observing, runless

    with observing(home, alias, runless(instance)):
        yield
