"""What every ``corpus-assets`` command shares, light enough to import before the command line
is parsed: the refusal error, the stderr note, JSON output, the audited-fields check,
``opened`` (the one way a command opens the data home), and ``lazy``, which names a command by
module so it is imported only when it runs (``--help`` and ``status`` never load Dagster,
pyarrow's readers or the release checks)."""

import argparse
import getpass
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, overload

if TYPE_CHECKING:
    from corpus_assets.core.runtime.workspace import Storage, Workspace

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
    run.target = (module, name)  # type: ignore[attr-defined]  # checked by the CLI's tests
    return run


@overload
def opened(
    writing: bool = False, *, exclusive: bool = False, config: Literal[True]
) -> AbstractContextManager["Workspace"]: ...


@overload
def opened(
    writing: bool = False, *, exclusive: bool = False, config: bool = False
) -> AbstractContextManager["Storage"]: ...


@contextmanager
def opened(
    writing: bool = False, *, exclusive: bool = False, config: bool = False
) -> Iterator["Storage"]:
    """The data home, the one way a command opens it; closed on exit (the catalog's engine and
    the store), whether the command succeeded or was refused.

    With a config (``--config``, ``$CORPUS_CONFIG``, ``$CORPUS_HOME/corpus.yaml``) it is the
    config's home, a ``Workspace``; else ``$CORPUS_HOME``, the store and catalog alone, unless
    ``config`` requires one (the config's own error then). ``writing``: the command puts objects
    in the CAS outside a build, or reads objects gc must not remove meanwhile, so it holds the
    CAS lock shared, as a build does; ``exclusive``: gc's lock. While the lock is taken by the
    other side, the command waits and says so."""
    from corpus_assets.core.runtime.config import config_path
    from corpus_assets.core.runtime.workspace import open_home, open_workspace

    home = open_workspace() if config or config_path().is_file() else open_home()
    with home:
        if not (writing or exclusive):
            yield home
            return
        with home.cas_lock(exclusive=exclusive, on_wait=note):
            yield home


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

    checked.target = getattr(run, "target", None)  # type: ignore[attr-defined]
    return checked
