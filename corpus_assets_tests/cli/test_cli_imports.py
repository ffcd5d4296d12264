"""The command line imports a command's code only when that command runs: ``--help`` loads no
project code but the parser, and ``status`` on a home without a Dagster instance no Dagster."""

import argparse
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus_assets.cli.parser import EXPORT_FORMATS
from corpus_assets.core.consumption.export_run import FORMATS

# Runs ``main(argv)`` in a fresh interpreter and prints the modules it ended with; as the
# console script runs it (``console=True``: the packages the command goes without) when the
# first argument is ``--console``.
PROBE = """\
import json, sys
from corpus_assets.cli.main import main
console = sys.argv[1:2] == ["--console"]
try:
    main(sys.argv[1 + console:], console=console)
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(
    argv: list[str], tmp_path: Path, env: dict[str, str] | None = None, console: bool = False
) -> set[str]:
    """The modules ``corpus-assets ARGV`` ended with, run in ``tmp_path``: by default on a data
    home and an instance of its own there, else on ``env``'s (``cli_process.cli_env``); with
    ``console``, as the console script runs a command."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
        env |= {"CORPUS_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *(["--console"] if console else []), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_help_imports_only_the_parser(tmp_path: Path) -> None:
    loaded = _modules_after(["--help"], tmp_path)
    assert not {m for m in loaded if m.startswith(("corpus_assets.core", "dagster"))}
    assert {m for m in loaded if m.startswith("corpus_assets.cli")} == {
        "corpus_assets.cli",
        "corpus_assets.cli.main",
        "corpus_assets.cli.common",
        "corpus_assets.cli.interrupt",
        "corpus_assets.cli.parser",
    }


def test_status_without_a_dagster_instance_imports_no_dagster(tmp_path: Path) -> None:
    loaded = _modules_after(["status"], tmp_path)
    assert "corpus_assets.cli.commands.status" in loaded  # the command ran
    assert not {m for m in loaded if m.startswith(("dagster", "corpus_assets.assets"))}


def test_the_parser_offers_every_export_format() -> None:
    assert EXPORT_FORMATS == FORMATS


def test_status_with_a_dagster_instance_imports_none_of_a_build(tmp_path: Path) -> None:
    """``status`` reads the instance's last runs: Dagster, but not the verifier, the gates or
    the layers a build runs (~1.3 s of imports it used to pay through the build module)."""
    from corpus_assets.cli.instance import DAGSTER_YAML

    (tmp_path / "dagster").mkdir()
    (tmp_path / "dagster" / "dagster.yaml").write_text(DAGSTER_YAML)
    loaded = _modules_after(["status"], tmp_path)
    assert "corpus_assets.cli.commands.status" in loaded and "dagster" in loaded
    build_side = (
        "corpus_assets.cli.runs",
        "corpus_assets.core.publication",
        "corpus_assets.core.audit",
        "corpus_assets.core.consumption",
        "corpus_assets.assets.",
    )
    # the instance's own classes (dagster.yaml names them), light: no layer, verifier or gate
    instance_side = {
        "corpus_assets.assets.run_workers",
        "corpus_assets.assets.instance",
        "corpus_assets.assets.event_log",  # the instance's SQLite event log (Dagster only)
        "corpus_assets.assets.partitions",
    }
    assert not {m for m in loaded if m.startswith(build_side)} - instance_side


def test_the_build_modules_import_no_scipy() -> None:
    """A build whose layers are all reused runs no graph: loading the Dagster definitions (what
    a build, the UI and every pool worker import) must not pay for scipy's ~0.4 s of imports;
    the leakage graph imports it when it computes components."""
    probe = (
        "import sys, corpus_assets.definitions;"
        "print(sorted(m for m in sys.modules if m.startswith('scipy')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, object]]:
    """Every (command line, run function) the parser can dispatch to."""
    if (run := parser.get_default("run")) is not None:
        yield parser.prog, run
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _commands(child)


def test_every_command_names_a_function_that_exists() -> None:
    """A lazily imported command names its module and function as strings: a typo (or a
    module moved without its name) would only fail when a user runs that command."""
    from corpus_assets.cli.common import COMMANDS
    from corpus_assets.cli.parser import parser

    commands = list(_commands(parser()))
    assert len(commands) > 30
    for line, run in commands:
        target = getattr(run, "target", None)
        if target is None:
            continue  # a function imported eagerly: it exists
        module, name = target
        assert callable(getattr(importlib.import_module(f"{COMMANDS}.{module}"), name)), line


# Runs ``main(argv, console=...)`` in a fresh interpreter, then tries to import pandas.
GOES_WITHOUT = """\
import sys
from corpus_assets.cli.main import main
main(sys.argv[2:], console=sys.argv[1] == "console")
try:
    import pandas
    print("pandas imported")
except ModuleNotFoundError as error:
    print(error)
"""


@pytest.mark.parametrize("console", [True, False])
def test_a_build_process_goes_without_pandas_only_as_the_console_script(
    tmp_path: Path, console: bool
) -> None:
    """pyarrow would import pandas at a build's first array (~0.25 CPU-s); the console script's
    ``build`` goes without it, but ``main`` called in another program's process (a notebook,
    these tests) never takes it away from that program."""
    assert importlib.util.find_spec("pandas") is not None, "without pandas this proves nothing"
    argv = ["console" if console else "caller", "--config", str(tmp_path / "none.yaml"), "build"]
    done = subprocess.run(
        [sys.executable, "-c", GOES_WITHOUT, *argv], capture_output=True, text=True, check=True
    )
    expected = "not imported in this process: pandas" if console else "pandas imported"
    assert done.stdout.splitlines()[-1] == expected


def test_signing_loads_securesystemslib_without_boto3() -> None:
    """Its AWS KMS signer would import boto3 (~0.15 CPU-s a process; never used here): hidden
    while securesystemslib loads, importable right after for the S3 store."""
    probe = (
        "import sys, corpus_assets.core.publication.signing\n"
        "print('securesystemslib.signer' in sys.modules, 'boto3' in sys.modules)\n"
        "import boto3\n"
        "print(boto3.client('s3', region_name='us-east-1').meta.region_name)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "us-east-1"]
