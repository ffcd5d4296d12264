"""A careless or hostile user's mistakes give one clear line, never a traceback,
before any Dagster partition exists; secrets in URLs never show; Ctrl-C stops a build cleanly.

Every command is a real ``corpus-assets`` process (``test_cli.run``) on a fresh home; nothing
here builds except the Ctrl-C test (the selftest lab's reference build and one interrupted one).
"""

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corpus_assets.cli.main import EXIT_BROKEN_PIPE
from corpus_assets.selftest.lab import PARTITION, Lab, parse_built
from corpus_assets_tests.cli_process import CLI, cli_env, run

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzzSECRET"
SOURCES = "sources:\n  - {id: docs, kind: objects, path: docs}\n"


def _home(tmp_path: Path, extra: str = "") -> Path:
    """A home whose config names one source folder ``docs`` (one small object)."""
    corpus = tmp_path / ".corpus"
    (corpus / "docs").mkdir(parents=True)
    (corpus / "docs" / "a.jsonl").write_text('{"id": "a1", "text": "one line of text"}\n')
    (corpus / "corpus.yaml").write_text(f"version: 1\npurpose: p\n{SOURCES}{extra}")
    return tmp_path


def _one_line(done: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """Exit ``code``; stderr is exactly one ``corpus-assets: error:`` line naming ``needles``."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("corpus-assets: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _no_partition(home: Path) -> None:
    """Nothing reached Dagster: no snapshots partition was added (the instance may not exist)."""
    dagster_home = home / ".dagster"
    if not (dagster_home / "dagster.yaml").exists():
        return
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(dagster_home)
    with DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions("snapshots") == []


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """A folder nobody can create files in, root included (``chattr +i`` when running as root,
    whom mode bits do not stop); made writable again afterwards so tmp_path can be removed."""
    path.mkdir(parents=True)
    path.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable:
        made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"running as root and chattr +i failed: {made.stderr.strip()}")
    try:
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_unreachable_postgresql_catalog_is_one_line(tmp_path: Path) -> None:
    home = _home(tmp_path)
    url = f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1:9/corpus"
    for args in (("build",), ("status",)):
        done = run(home, *args, extra_env={"CORPUS_CATALOG_URL": url})
        _one_line(done, 1, "catalog", "127.0.0.1", "9")
        assert SECRET not in done.stdout + done.stderr
    _no_partition(home)


def test_storage_home_that_is_not_a_writable_folder(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    home = _home(tmp_path, f"storage: {{home: {tmp_path / 'a-file'}}}\n")
    _one_line(run(home, "build"), 1, "storage.home", "a-file", "not a folder")
    with read_only_folder(tmp_path / "locked") as locked:
        config = home / ".corpus" / "corpus.yaml"
        config.write_text(f"version: 1\npurpose: p\n{SOURCES}storage: {{home: {locked}}}\n")
        _one_line(run(home, "build"), 1, "storage.home", str(locked), "not a writable folder")
    _no_partition(home)


def test_a_source_path_that_is_a_file(tmp_path: Path) -> None:
    home = _home(tmp_path)
    config = home / ".corpus" / "corpus.yaml"
    config.write_text(config.read_text() + "  - {id: other, kind: objects, path: docs/a.jsonl}\n")
    _one_line(run(home, "build"), 1, "source 'other'", "a.jsonl", "not a folder")
    _no_partition(home)


def test_a_missing_config_file_is_a_usage_error(tmp_path: Path) -> None:
    home = _home(tmp_path)
    for command in ("status", "build", "verify"):
        done = run(
            home, "--config", str(tmp_path / "nope.yaml"), command, *(["x"] * (command == "verify"))
        )
        _one_line(done, 2, "--config", "nope.yaml", "not found")
    _no_partition(home)


def test_export_out_on_a_file_or_an_unwritable_path(tmp_path: Path) -> None:
    """Refused before the permit is taken, so even an unknown snapshot gets the --out error."""
    home = _home(tmp_path)
    digest = "sha256:" + "0" * 64
    export = ("export", "megatron", digest, "--run-id", "r", "--purpose", "p", "--out")
    (tmp_path / "exists").write_text("keep me\n")
    _one_line(run(home, *export, str(tmp_path / "exists")), 1, "--out", "not a folder")
    assert (tmp_path / "exists").read_text() == "keep me\n"
    _one_line(run(home, *export, str(tmp_path / "exists" / "sub")), 1, "--out", "writable folder")
    with read_only_folder(tmp_path / "locked") as locked:
        _one_line(run(home, *export, str(locked / "out")), 1, "--out", "not a writable folder")
        _one_line(run(home, *export, str(locked)), 1, "--out", "not a writable folder")


def test_credentials_in_a_cas_url_never_show(tmp_path: Path) -> None:
    """A malformed ``s3://KEY:SECRET@...`` in the config or the environment: one line, masked,
    in every stream; and nothing under the home or the Dagster home holds it."""
    bad = f"s3://AKIAEXAMPLE:{SECRET}@Not_A_Bucket/x"
    home = _home(tmp_path, f"storage: {{cas_url: '{bad}'}}\n")
    done = run(home, "build")
    _one_line(done, 1, "s3://AKIAEXAMPLE:***@Not_A_Bucket/x")
    assert SECRET not in done.stdout
    config = home / ".corpus" / "corpus.yaml"
    config.write_text(f"version: 1\npurpose: p\n{SOURCES}")
    for args in (("build",), ("status",), ("verify", "sha256:" + "0" * 64)):
        done = run(home, *args, extra_env={"CORPUS_CAS_URL": bad})
        _one_line(done, 1, "s3://AKIAEXAMPLE:***@")
        assert SECRET not in done.stdout
    _nowhere_on_disk(home, SECRET)


def _nowhere_on_disk(root: Path, secret: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


# Ctrl-C ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    made = Lab(tmp_path_factory.mktemp("interrupts"))
    yield made
    made.close()


@pytest.mark.heavy  # a crash test: CLI builds interrupted mid-run and resumed
@pytest.mark.parametrize("point", ["task/canonical_records", "validate/*"])
def test_ctrl_c_stops_a_build_in_one_line_and_the_next_build_resumes(
    lab: Lab, point: str, tmp_path: Path
) -> None:
    """SIGINT to the build's process group (what a terminal sends) while pool workers or the
    Dagster run are mid-step: exit 130, one line, no traceback; the rerun completes with the
    undisturbed build's snapshotId."""
    reference = lab.reference()
    home = lab.standard_home("ctrl-c")
    config = home.config.read_text() + "execution: {workers: 2, in_process_bytes: 0}\n"
    home.config.write_text(config)
    folder = tmp_path / "points"
    folder.mkdir()
    env = {"CORPUS_FAILPOINTS": f"{point}=pause@1", "CORPUS_FAILPOINT_DIR": str(folder)}
    build = home.start("build", "--partition", PARTITION, env=env)
    try:
        deadline = time.monotonic() + 300
        while not list(folder.glob("*.paused")):
            assert build.poll() is None and time.monotonic() < deadline, build.communicate()
            time.sleep(0.02)
        os.killpg(build.pid, signal.SIGINT)
        _out, err = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
    assert build.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1:] == [
        "corpus-assets: interrupted; finished work is kept, rerun to resume"
    ], err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    resumed = home.cli("build", "--partition", PARTITION)
    assert resumed.code == 0, resumed.err
    assert "Traceback" not in resumed.err, resumed.err
    assert parse_built(resumed.out).snapshot_id == reference.snapshot_id


def test_a_reader_that_goes_away_ends_a_command_quietly(tmp_path: Path) -> None:
    """``corpus-assets status | head``: the reader closes the pipe before the command writes;
    the command ends with SIGPIPE's code and no traceback, as a Unix tool does."""
    home = _home(tmp_path)
    read, write = os.pipe()
    os.close(read)  # gone before the first byte
    try:
        done = subprocess.run(
            [CLI, "status"],
            cwd=home,
            env=cli_env(home),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == EXIT_BROKEN_PIPE == 141
    assert done.stderr == ""
