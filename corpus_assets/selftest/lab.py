"""Where fault cases run: fresh data homes (each with its own catalog) driven through the CLI.

Every command is a real ``corpus-assets`` process (``python -m corpus_assets.cli``), so a case
exercises what a user runs: the ``build_snapshot`` job, the gate, the registries. With a
PostgreSQL ``catalog`` URL each home gets its own database on that server (created and dropped
here; the role needs CREATEDB), otherwise the embedded SQLite catalog in the home.
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpus_assets.selftest.corpus import write_objects

PARTITION = "p1"  # the partition key every compared build uses
_BUILT = re.compile(r"snapshotId (sha256:[0-9a-f]{64}) state (\w+)")
_PARTITION = re.compile(r"^partition (\S+): 7 layers", re.M)


class SelftestError(RuntimeError):
    """A step a case needs (not the fault under test) failed; the message says which."""


@dataclass(frozen=True)
class Ran:
    """A finished CLI process."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def error_line(self) -> str:
        return error_line(self.err) or f"exit {self.code}"

    def refused_in_one_line(self, code: int, *needles: str) -> bool:
        """Exit ``code`` with exactly one ``corpus-assets: error:`` line naming every needle,
        and no traceback: how every refusal of bad input must look."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        return (
            self.code == code
            and "Traceback" not in self.err
            and len(lines) == 1
            and lines[0].startswith("corpus-assets: error: ")
            and all(needle in lines[0] for needle in needles)
        )

    def first_failure(self) -> str:
        """``verify``'s first ``FAIL`` line (what it found), else the error line."""
        failed = [line for line in self.err.splitlines() if line.startswith("FAIL ")]
        return (failed or [self.error_line()])[0]


def error_line(err: str) -> str:
    """The CLI's one-line error, else a traceback's exception line, else the last line."""
    lines = [line for line in err.splitlines() if line.strip()]
    named = [line for line in lines if line.startswith("corpus-assets: error:")]
    raised = [line for line in lines if not line[0].isspace() and "Error" in line.split(":")[0]]
    return (named or raised or lines or [""])[-1]


@dataclass(frozen=True)
class Built:
    """What ``corpus-assets build`` printed."""

    partition: str
    snapshot_id: str
    state: str


@dataclass
class Home:
    """One data home: its config, sources folder, Dagster home and catalog."""

    dir: Path
    catalog_url: str | None
    sources: Path = field(init=False)
    config: Path = field(init=False)

    def __post_init__(self) -> None:
        self.sources = self.dir / "sources"
        self.config = self.dir / "corpus.yaml"
        self.sources.mkdir(parents=True, exist_ok=True)

    def configure(self, sources: list[dict[str, Any]], extra: str = "") -> None:
        """Write ``corpus.yaml`` for ``sources`` (JSON flow maps are YAML) under this home."""
        storage: dict[str, str] = {"home": str(self.dir / "data")}
        if self.catalog_url:
            storage["catalog_url"] = self.catalog_url
        lines = ["version: 1", "purpose: selftest", f"storage: {json.dumps(storage)}", "sources:"]
        lines += [f"  - {json.dumps(source)}" for source in sources]
        self.config.write_text("\n".join(lines) + "\n" + extra)

    @property
    def trust_file(self) -> Path:
        """The lab's trust root: outside every home, shared by a home and its copies (as an
        operator's is), never the user's own."""
        return self.dir.parent / "trust.json"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
        env.update(CORPUS_CONFIG=str(self.config), DAGSTER_HOME=str(self.dir / "dagster"))
        env.update(CORPUS_TRUST_FILE=str(self.trust_file))
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "corpus_assets.cli", *args]

    def cli(self, *args: str, timeout: float = 600) -> Ran:
        done = subprocess.run(
            self.command(*args),
            env=self.env(),
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Ran(args, done.returncode, done.stdout, done.stderr)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """A CLI process in its own process group (a case may SIGKILL the whole group)."""
        return subprocess.Popen(
            self.command(*args),
            env={**self.env(), **(env or {})},
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def build(self, *args: str) -> Built:
        """``corpus-assets build`` that must succeed."""
        ran = self.cli("build", *args)
        if ran.code != 0:
            raise SelftestError(f"build {' '.join(args)} failed: {ran.error_line()}")
        return parse_built(ran.out)

    def publish(self, snapshot_id: str) -> None:
        """Approve and activate through the gate, as an operator would (must succeed)."""
        self.must("approve", snapshot_id, "--by", "selftest")
        self.must("activate", snapshot_id)

    def must(self, *args: str) -> Ran:
        """A CLI step the case relies on (not the fault): it must succeed."""
        ran = self.cli(*args)
        if ran.code != 0:
            raise SelftestError(f"{' '.join(args)} failed: {ran.error_line()}")
        return ran


def parse_built(out: str) -> Built:
    """The partition and snapshotId a build printed."""
    built, partition = _BUILT.search(out), _PARTITION.search(out)
    if built is None or partition is None:
        raise SelftestError(f"build printed no snapshotId: {out[-300:]!r}")
    return Built(partition.group(1), built.group(1), built.group(2))


class Lab:
    """Fresh homes under ``root``; PostgreSQL databases made per home when ``catalog`` is a
    server URL (dropped by ``close``)."""

    def __init__(self, root: Path, catalog: str | None = None, *, full: bool = False) -> None:
        self.root, self.catalog, self.full = root, catalog, full
        self._databases: list[str] = []
        self._reference: tuple[Home, Built] | None = None
        self.rng = random.Random(int(os.environ.get("CORPUS_SELFTEST_SEED", "17")))

    def home(self, name: str) -> Home:
        """A fresh home, its Dagster instance already created (a copy of one made once: a
        new instance's storage takes seconds to create, every case would pay it)."""
        path = self.root / f"{name}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(self._dagster_template(), path / "dagster")
        return Home(path, self._database() if self.catalog else None)

    def _dagster_template(self) -> Path:
        template = self.root / "dagster-template"
        if not template.is_dir():
            made = template.with_name(template.name + ".tmp")
            code = "from corpus_assets.cli.instance import dagster_instance; dagster_instance()"
            env = {**os.environ, "DAGSTER_HOME": str(made)}
            subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
            made.rename(template)
        return template

    @property
    def standard_sources(self) -> Path:
        """The standard corpus (``corpus.write_objects``), written once and never changed: homes
        whose source is this one folder and whose partition is ``PARTITION`` build the same
        snapshotId (a source's path is part of what a snapshot records)."""
        folder = self.root / "standard-sources"
        if not folder.is_dir():
            folder.mkdir(parents=True)
            write_objects(folder)
        return folder

    def standard_home(self, name: str) -> Home:
        """A fresh home whose one source ``docs`` is the standard corpus."""
        home = self.home(name)
        home.configure([{"id": "docs", "kind": "objects", "path": str(self.standard_sources)}])
        return home

    def reference(self) -> Built:
        """The undisturbed build of the standard corpus at ``PARTITION`` (once per lab)."""
        return self._reference_home()[1]

    def _reference_home(self) -> tuple[Home, Built]:
        if self._reference is None:
            home = self.standard_home("reference")
            self._reference = home, home.build("--partition", PARTITION)
        return self._reference

    def copy_of_reference(self, name: str) -> tuple[Home, Built]:
        """A new home holding what the reference build left (its data home, Dagster home and
        catalog, copied): a case that damages or races a built snapshot starts here instead
        of building again."""
        source, built = self._reference_home()
        path = self.root / f"{name}-{uuid.uuid4().hex[:6]}"
        url = self._database(template=source.catalog_url) if self.catalog else None
        home = Home(path, url)
        for part in ("data", "dagster"):
            shutil.copytree(source.dir / part, path / part, symlinks=True)
        home.configure([{"id": "docs", "kind": "objects", "path": str(self.standard_sources)}])
        return home, built

    def _database(self, template: str | None = None) -> str:
        """A new database on the catalog's server (a copy of ``template``'s when given)."""
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        url = make_url(self.catalog or "")
        name = f"{url.database or 'corpus'}_selftest_{uuid.uuid4().hex[:10]}"
        copy = f' TEMPLATE "{make_url(template).database}"' if template else ""
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"{copy}'))
        engine.dispose()
        self._databases.append(name)
        return url.set(database=name).render_as_string(hide_password=False)

    def close(self, keep: bool = False) -> None:
        """Drop the databases this lab made; remove its homes unless ``keep``."""
        if self._databases:
            from sqlalchemy import create_engine, text
            from sqlalchemy.engine import make_url

            engine = create_engine(make_url(self.catalog or ""), isolation_level="AUTOCOMMIT")
            with engine.connect() as connection:
                for name in self._databases:
                    connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            engine.dispose()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
