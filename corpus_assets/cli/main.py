"""``corpus-assets``: build, verify, approve, activate and inspect snapshots without the UI.

Builds and activations run the same Dagster jobs the UI and sensors run, on the instance in
``DAGSTER_HOME`` (default: the folder's ``dagster.yaml``, else ``./.dagster``; ``cli.instance``),
so every CLI run shows up in ``dagster dev`` afterwards.
The command line is ``cli.parser``; each command's module is imported only when it runs.
"""

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from corpus_assets.cli import interrupt
from corpus_assets.cli.parser import parser, with_add

# The refusals a command may raise (module, class): one line each, exit 1. Looked up in the
# modules already imported (an error of a module never imported cannot have been raised).
EXPECTED_ERRORS = (
    ("corpus_assets.core.consumption.training", "TrainingError"),
    ("corpus_assets.cli.common", "CliError"),
    ("corpus_assets.core.runtime.config", "ConfigError"),
    ("corpus_assets.core.storage.cas", "CasError"),
    ("corpus_assets.core.governance.states", "StateError"),
    ("corpus_assets.core.governance.alias_gate", "AliasGateError"),
    ("corpus_assets.core.publication.publish", "PublishError"),
    ("corpus_assets.core.runtime.keys", "PartitionKeyError"),
    ("corpus_assets.core.ingest.sources", "SourceError"),
    ("corpus_assets.core.storage.catalog", "LayerConflict"),
    ("corpus_assets.core.publication.manifest", "BuildConflict"),
    ("corpus_assets.core.ingest.pinning", "PinError"),
    ("corpus_assets.core.publication.signing", "SignatureError"),
    ("corpus_assets.core.publication.trust_root", "TrustRootError"),
    ("corpus_assets.core.tokens.spec", "TokenizerError"),
    ("corpus_assets.core.consumption.export_run", "ExportError"),
    ("corpus_assets.core.governance.audit_fields", "AuditFieldError"),
)
EXIT_USAGE = 2  # argparse's code for a command line that cannot run
EXIT_BROKEN_PIPE = 128 + 13  # the reader of stdout went away (``status | head``): SIGPIPE's


def _loaded(named: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    """The classes of ``named`` whose module is imported."""
    return tuple(getattr(sys.modules[m], c) for m, c in named if m in sys.modules)


def main(argv: list[str] | None = None, console: bool = False) -> int:
    """Run one command; expected errors become one ``corpus-assets: error:`` line and exit 1
    (a command line naming a missing ``--config`` exits 2, as argparse's usage errors do).
    Every line is masked (``url_secrets``): no password in a URL reaches the terminal. As the
    console script (``console``: the process is this command's alone) a command goes without
    the packages it names (``goes_without``); called in another program's process, it does not
    take them away from it."""
    # Dagster's own beta/preview notices are for framework users, not for this command's users.
    warnings.filterwarnings("ignore", module="dagster")
    args = parser().parse_args(with_add(sys.argv[1:] if argv is None else argv))
    if console and getattr(args, "goes_without", ()):
        from corpus_assets.core.runtime.absent_imports import go_without

        go_without(*args.goes_without)
    if console and getattr(args, "defers_collections", False):
        from corpus_assets._gc import defer_collections

        defer_collections()  # until the run freezes the start-up heap (storage.memory)
    if args.config:
        config = Path(args.config).resolve()
        if not config.is_file():
            what = "is not a file" if config.exists() else "not found"
            return _error(f"--config {config}: {what}", EXIT_USAGE)
        os.environ["CORPUS_CONFIG"] = str(config)
    try:
        with interrupt.sigterm_default():
            return args.run(args)
    except Exception as error:
        if isinstance(error, _loaded(EXPECTED_ERRORS)):
            return _error(str(error))
        # the catalog database: unreachable, refusing, read-only
        if isinstance(error, _loaded((("sqlalchemy.exc", "OperationalError"),))):
            orig = getattr(error, "orig", None)
            reason = str(orig).strip().splitlines()[0] if orig else type(error).__name__
            return _error(f"catalog database: {reason}")
        raise


def _error(text: str, code: int = 1) -> int:
    from corpus_assets.core.storage.url_secrets import masked

    print(f"corpus-assets: error: {masked(text)}", file=sys.stderr)
    return code


def run() -> None:
    """The console script: ``main``, then exit without interpreter finalisation.

    With pyarrow and DuckDB loaded, tearing down their C++ thread pools at interpreter exit
    sometimes aborts the finished process ("terminate called without an active exception",
    exit -6; apache/arrow#34314), after its output was written. Every store and catalog write is
    committed by then, so the process closes the Dagster event log's kept SQLite connections,
    flushes its streams and leaves with its own exit code. A reader of its output that went
    away (``status | head``) ends it quietly with SIGPIPE's code, as a Unix tool.
    """
    interrupt.install()
    sys.excepthook = _masked_traceback
    try:
        code = main(console=True)
        sys.stdout.flush()
    except BrokenPipeError:  # quietly, as a Unix tool killed by SIGPIPE: no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        code = EXIT_BROKEN_PIPE
    event_log = sys.modules.get("corpus_assets.assets.event_log")  # loaded by a Dagster instance
    if event_log is not None:
        event_log.close_all_connections()  # os._exit skips atexit
    sys.stderr.flush()
    os._exit(code)


def _masked_traceback(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    """An unexpected error still shows its traceback (it is a bug to report), masked."""
    import traceback

    from corpus_assets.core.storage.url_secrets import masked

    sys.stderr.write(masked("".join(traceback.format_exception(kind, error, tb))))
