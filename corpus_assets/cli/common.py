"""What every ``corpus-assets`` command shares, light enough to import before the command line
is parsed: the refusal error, the stderr note, JSON output, the audited-fields check, the data
home opener, and ``lazy``, which names a command by module so it is imported only when it runs
(``--help`` and ``status`` never load Dagster, pyarrow's readers or the release checks)."""

import argparse
import getpass
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corpus_assets.core.storage.cas import ContentStore
    from corpus_assets.core.storage.catalog import Catalog

Command = Callable[[argparse.Namespace], int]
COMMANDS = "corpus_assets.cli.commands"  # one module per group of commands


class CliError(RuntimeError):
    """A refusal of the command itself; printed as the one error line."""


def lazy(module: str, name: str) -> Command:
    """The command ``corpus_assets.cli.commands.<module>.<name>``, imported when it runs."""

    def run(args: argparse.Namespace) -> int:
        command: Command = getattr(importlib.import_module(f"{COMMANDS}.{module}"), name)
        return command(args)

    run.__qualname__ = run.__name__ = name
    return run


def storage() -> tuple[Path, "ContentStore", "Catalog"]:
    """The data home named by the config if there is one, else ``$CORPUS_HOME``."""
    from corpus_assets.core.runtime.config import config_path
    from corpus_assets.core.runtime.workspace import open_home, open_workspace

    if config_path().is_file():
        ws = open_workspace()
        return ws.home, ws.cas, ws.catalog
    return open_home()


@contextmanager
def writing_storage() -> Iterator[tuple[Path, "ContentStore", "Catalog"]]:
    """``storage()`` for a command that puts objects in the CAS outside a build: it holds the
    CAS lock shared, as a build does, so gc cannot remove what it wrote before the catalog (or
    its caller) names it; while gc runs, the command waits and says so."""
    from corpus_assets.core.storage.cas_lock import cas_lock

    home, cas, catalog = storage()
    with cas_lock(home, cas, catalog.url, exclusive=False, on_wait=note):
        yield home, cas, catalog


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def print_json(payload: Any) -> int:
    print(json.dumps(payload, indent=2, sort_keys=True))
    return 0


def cli_actor() -> str:
    """Who a registry or alias change made from the CLI is recorded as (the login name comes
    from ``$LOGNAME``/``$USER`` first, so it is an audit field like any other)."""
    from corpus_assets.core.governance.audit_fields import audit_field

    return audit_field("actor (login name)", f"cli:{getpass.getuser()}")


def audited(run: Command, **fields: str) -> Command:
    """``run`` behind the boundary check of the audit fields it writes to the catalog: each
    keyword maps an argument's ``dest`` to the name its one-line refusal shows (the flag), and
    the check runs before the command opens anything (``core.governance.audit_fields``)."""

    def checked(args: argparse.Namespace) -> int:
        from corpus_assets.core.governance.audit_fields import audit_field

        for dest, shown in fields.items():
            given = getattr(args, dest, None)
            for value in given if isinstance(given, list) else [given]:
                if value is not None:
                    audit_field(shown, value)
        return run(args)

    return checked
