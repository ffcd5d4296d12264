"""A refusal of the core as a run's one-line failure (a ``Failure``: no stack trace to read)."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from corpus_assets.core.governance.alias_gate import AliasGateError
from corpus_assets.core.governance.benchmarks import RegistryError
from corpus_assets.core.governance.states import StateError
from corpus_assets.core.publication.publish import PublishError

REFUSALS = (ValueError, LookupError, AliasGateError, RegistryError, PublishError, StateError)


@contextmanager
def refused_in_one_line() -> Iterator[None]:
    """A refusal of the core (bad input, a gate, registry or publication rule) as the run's
    one-line failure."""
    try:
        yield
    except REFUSALS as error:
        raise dg.Failure(description=str(error), allow_retries=False) from None
