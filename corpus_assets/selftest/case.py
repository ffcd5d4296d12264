"""One fault case: what the seed expects, and what a run of it observed."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corpus_assets.selftest.lab import Lab

NO_LOSS = "none"


@dataclass(frozen=True)
class Outcome:
    """What one run of a case saw. ``matched``: the observed outcome is the seed's expected one;
    ``lost``: verified data the fault destroyed (``none`` or what); ``digests_equal``: the
    snapshotId equals an undisturbed build's (None where no build is compared)."""

    observed: str
    matched: bool
    lost: str = NO_LOSS
    digests_equal: bool | None = None

    @property
    def ok(self) -> bool:
        return self.matched and self.lost == NO_LOSS and self.digests_equal is not False


@dataclass(frozen=True)
class FaultCase:
    """A fault from a seed. ``quick``: part of the set CI and ``selftest --faults`` run by
    default (a case marked slow runs with ``--full`` or pytest ``-m slow``). ``catalog``: the
    outcome goes through the catalog's transactions (states, gate, tasks, registries), so CI
    runs it on PostgreSQL as well as SQLite; a case about stored bytes or the network alone
    runs on SQLite in CI (``--catalog`` runs every case on the server it names)."""

    name: str
    seed: str
    fault: str
    expected: str
    run: Callable[["Lab"], Outcome]
    quick: bool = True
    catalog: bool = True


CASES: list[FaultCase] = []


def fault(
    name: str, seed: str, fault: str, expected: str, *, quick: bool = True, catalog: bool = True
) -> Callable[[Callable[["Lab"], Outcome]], Callable[["Lab"], Outcome]]:
    """Register the decorated function as a case (names are unique)."""

    def register(run: Callable[["Lab"], Outcome]) -> Callable[["Lab"], Outcome]:
        if any(case.name == name for case in CASES):
            raise ValueError(f"fault case {name!r} is registered twice")
        CASES.append(FaultCase(name, seed, fault, expected, run, quick, catalog))
        return run

    return register
