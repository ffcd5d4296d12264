"""A careless user's mistakes get one line and no traceback, before
any Dagster partition is added; a secret in a store URL is never shown; Ctrl-C stops a build in
one line and the rerun resumes to the undisturbed build's snapshotId."""

import os
import signal
import subprocess
import time
from pathlib import Path

from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.lab import PARTITION, Home, Lab, Ran, parse_built

SEED = "031"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzzSECRET"
INTERRUPTED = "corpus-assets: interrupted; finished work is kept, rerun to resume"


def _cli(home: Home, *args: str, env: dict[str, str] | None = None) -> Ran:
    done = subprocess.run(
        home.command(*args),
        env={**home.env(), **(env or {})},
        cwd=home.dir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Ran(args, done.returncode, done.stdout, done.stderr)


def _no_partition(home: Home) -> bool:
    """No snapshots partition reached the home's Dagster instance."""
    from dagster import DagsterInstance

    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home.dir / "dagster")  # its dagster.yaml reads it
    try:
        with DagsterInstance.get() as instance:
            return instance.get_dynamic_partitions("snapshots") == []
    finally:
        if before is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = before


def _refused(home: Home, ran: Ran, code: int, *needles: str) -> Outcome:
    return Outcome(
        observed=f"exit {ran.code}: {ran.error_line()}",
        matched=ran.refused_in_one_line(code, *needles) and _no_partition(home),
        lost=NO_LOSS,
        digests_equal=None,  # nothing was built
    )


def _config(home: Home, extra: str) -> None:
    home.config.write_text(home.config.read_text() + extra)


@fault(
    "attack.8-unreachable-catalog",
    SEED,
    "build and status with the catalog on a PostgreSQL port nobody listens on",
    "one line naming the catalog, exit 1, no traceback, no partition added",
    catalog=False,
)
def unreachable_catalog(lab: Lab) -> Outcome:
    home = lab.standard_home("unreachable-catalog")
    url = f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1:9/corpus"
    ran = _cli(home, "build", env={"CORPUS_CATALOG_URL": url})
    status = _cli(home, "status", env={"CORPUS_CATALOG_URL": url})
    shown = SECRET in ran.out + ran.err + status.out + status.err
    outcome = _refused(home, ran, 1, "catalog database", "127.0.0.1")
    matched = outcome.matched and status.refused_in_one_line(1, "catalog database") and not shown
    return Outcome(outcome.observed, matched, NO_LOSS, None)


@fault(
    "attack.8-home-is-a-file",
    SEED,
    "storage.home names a file",
    "one line: storage.home ... not a folder; exit 1; the file untouched; no partition added",
    catalog=False,
)
def home_is_a_file(lab: Lab) -> Outcome:
    home = lab.standard_home("home-is-a-file")
    target = home.dir / "a-file"
    target.write_text("not a folder\n")
    text = home.config.read_text().replace(str(home.dir / "data"), str(target))
    home.config.write_text(text)
    outcome = _refused(home, home.cli("build"), 1, "storage.home", "not a folder")
    kept = target.read_text() == "not a folder\n"
    return Outcome(outcome.observed, outcome.matched, NO_LOSS if kept else "the file", None)


@fault(
    "attack.8-source-is-a-file",
    SEED,
    "a source path names a file, not a folder",
    "one line naming the source and 'not a folder'; exit 1; no partition added",
    catalog=False,
)
def source_is_a_file(lab: Lab) -> Outcome:
    home = lab.standard_home("source-is-a-file")
    some_file = next(p for p in sorted(lab.standard_sources.rglob("*")) if p.is_file())
    _config(home, f"  - {{id: other, kind: objects, path: '{some_file}'}}\n")
    return _refused(home, home.cli("build"), 1, "source 'other'", "not a folder")


@fault(
    "attack.8-missing-config",
    SEED,
    "--config names a file that does not exist (status used to ignore it and exit 0)",
    "one line naming --config, exit 2 (a usage error), for status and build",
    catalog=False,
)
def missing_config(lab: Lab) -> Outcome:
    home = lab.standard_home("missing-config")
    status = home.cli("--config", str(home.dir / "nope.yaml"), "status")
    build = home.cli("--config", str(home.dir / "nope.yaml"), "build")
    outcome = _refused(home, build, 2, "--config", "not found")
    matched = outcome.matched and status.refused_in_one_line(2, "--config", "not found")
    return Outcome(f"status {status.error_line()}; build {outcome.observed}", matched)


@fault(
    "attack.8-export-over-a-file",
    SEED,
    "export --out names an existing file, then a path under it",
    "one line naming --out, exit 1, before a permit is taken; the file is unchanged and the "
    "snapshot still verifies",
    catalog=False,
)
def export_over_a_file(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("export-over-a-file")
    target = home.dir / "precious.txt"
    target.write_text("keep me\n")
    export = ("export", "megatron", built.snapshot_id, "--run-id", "r", "--purpose", "selftest")
    over = home.cli(*export, "--out", str(target))
    under = home.cli(*export, "--out", str(target / "sub"))
    verify = home.cli("verify", built.snapshot_id)
    kept = target.read_text() == "keep me\n"
    return Outcome(
        observed=f"exit {over.code}: {over.error_line()}; under it: {under.error_line()}",
        matched=over.refused_in_one_line(1, "--out", "not a folder")
        and under.refused_in_one_line(1, "--out", "writable folder"),
        lost=NO_LOSS if kept else f"{target} was overwritten",
        digests_equal=verify.code == 0,
    )


@fault(
    "attack.8-s3-secret-masked",
    SEED,
    "storage.cas_url and CORPUS_CAS_URL written s3://KEY:SECRET@Bad_Bucket/x",
    "one line with s3://KEY:***@...; the secret in no output stream and no file of the home",
    catalog=False,
)
def s3_secret_masked(lab: Lab) -> Outcome:
    home = lab.standard_home("s3-secret")
    bad = f"s3://AKIAEXAMPLE:{SECRET}@Not_A_Bucket/x"
    original = home.config.read_text()
    home.config.write_text(original.replace('"home":', f'"cas_url": "{bad}", "home":'))
    in_config = home.cli("build")
    home.config.write_text(original)
    in_env = _cli(home, "build", env={"CORPUS_CAS_URL": bad})
    streams = in_config.out + in_config.err + in_env.out + in_env.err
    on_disk = [p for p in home.dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    masked = "s3://AKIAEXAMPLE:***@"
    return Outcome(
        observed=f"config: {in_config.error_line()}; env: {in_env.error_line()}",
        matched=in_config.refused_in_one_line(1, masked)
        and in_env.refused_in_one_line(1, masked)
        and SECRET not in streams
        and not on_disk,
        lost=NO_LOSS,
        digests_equal=None,
    )


@fault(
    "attack.8-ctrl-c-build",
    SEED,
    "SIGINT to the build's process group while pool workers are mid-task",
    "exit 130 with one line and no traceback; the rerun resumes to the reference snapshotId",
    catalog=False,
)
def ctrl_c_build(lab: Lab) -> Outcome:
    reference = lab.reference()
    home = lab.standard_home("ctrl-c")
    _config(home, "execution: {workers: 2, in_process_bytes: 0}\n")
    folder = home.dir / "points"
    folder.mkdir()
    env = {
        "CORPUS_FAILPOINTS": "task/canonical_records=pause@1",
        "CORPUS_FAILPOINT_DIR": str(folder),
    }
    err, code = _interrupted(home.start("build", "--partition", PARTITION, env=env), folder)
    lines = [line for line in err.splitlines() if line.strip()]
    resumed = home.cli("build", "--partition", PARTITION)
    sid = parse_built(resumed.out).snapshot_id if resumed.code == 0 else None
    return Outcome(
        observed=f"exit {code}: {lines[-1] if lines else ''}; rerun exit {resumed.code}",
        matched=code == 130 and lines == [INTERRUPTED] and "Traceback" not in resumed.err,
        lost=NO_LOSS if resumed.code == 0 else f"rerun failed: {resumed.error_line()}",
        digests_equal=sid == reference.snapshot_id,
    )


def _interrupted(build: "subprocess.Popen[str]", folder: Path) -> tuple[str, int]:
    """SIGINT the build's group once a pause point is reached; its stderr and exit code."""
    try:
        deadline = time.monotonic() + 300
        while not list(folder.glob("*.paused")):
            if build.poll() is not None or time.monotonic() > deadline:
                return build.communicate()[1], build.wait()
            time.sleep(0.02)
        os.killpg(build.pid, signal.SIGINT)
        return build.communicate(timeout=60)[1], build.wait()
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
