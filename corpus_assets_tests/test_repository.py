"""Promises about the repository itself: layering, the front door, the instance config."""

import ast
import itertools
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable

import pytest
import yaml
from _pytest.mark.expression import Expression

from corpus_assets.core.runtime.config import parse_config
from corpus_assets_tests.paths import REPO


def test_every_core_stage_is_in_the_layering_contract() -> None:
    """`lint-imports` (run by `make test`) only guards the stages it names: a new subpackage of
    core must take its place in the layers, or it could import anything."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers")["layers"]
    layered = [m.strip() for layer in layers for m in layer.split("|")]  # "a | b": siblings
    core = REPO / "corpus_assets" / "core"
    stages = {p.name for p in core.iterdir() if (p / "__init__.py").is_file()}
    stages |= {p.stem for p in core.glob("*.py") if p.stem != "__init__"}
    assert sorted(layered) == sorted(f"corpus_assets.core.{s}" for s in stages)
    forbidden = {m for c in contracts["contracts"] for m in c.get("forbidden_modules", [])}
    assert {"dagster", "corpus_assets.assets", "corpus_assets.cli"} <= forbidden


def test_ci_runs_the_readme_test_commands() -> None:
    readme = (REPO / "README.md").read_text().split("## Open the UI")[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test " in readme and "make test-slow " in readme
    assert "\nmake test\nmake test-slow\n" in ci


def _tier(name: str) -> str:
    """A marker expression the Makefile defines (``NAME := expression``)."""
    makefile = (REPO / "Makefile").read_text()
    (expression,) = re.findall(rf"^{name} := (.+)$", makefile, re.MULTILINE)
    return expression


def _markers() -> list[str]:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return [line.split(":")[0] for line in ini["markers"]]


def test_the_test_tiers_partition_every_test() -> None:
    """For every combination of registered markers a test could carry, exactly one of
    ``make test``, ``make test-slow`` and ``make test-soak`` selects it, and the fast tier is
    the default selection (so a bare ``pytest`` runs what ``make test`` runs)."""
    tiers = [Expression.compile(_tier(n)) for n in ("FAST_TIER", "SLOW_TIER", "SOAK_TIER")]
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert f"-m '{_tier('FAST_TIER')}'" in ini["addopts"]
    markers = _markers()
    assert {"slow", "heavy", "browser", "faults"} <= set(markers)
    for carried in itertools.product([False, True], repeat=len(markers)):
        has = dict(zip(markers, carried, strict=True))
        matcher = _carrying(has)
        assert sum(tier.evaluate(matcher) for tier in tiers) == 1, has


def _carrying(has: dict[str, bool]) -> Callable[..., bool]:
    """A marker matcher for a test carrying the markers ``has`` maps to True."""
    return lambda name, /, **_kwargs: has.get(name, False)


def _collected(expression: str) -> set[str]:
    """The node ids ``pytest -m expression`` selects (collected only, not run)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:xdist",
            "-m",
            expression,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.heavy  # three collections of the whole suite, about a minute
def test_the_collected_tiers_are_disjoint_and_keep_every_test() -> None:
    """Collected for real: no test is in both tiers, and the two together hold every test the
    single default selection (``not slow``) held before the suite was split."""
    fast, slow = _collected(_tier("FAST_TIER")), _collected(_tier("SLOW_TIER"))
    assert fast and slow and not fast & slow
    assert _collected("not slow") <= fast | slow


@pytest.mark.heavy  # a collection of the whole suite
def test_every_heavy_test_listed_is_a_collected_test() -> None:
    """A renamed or removed test must leave ``heavy_tests.txt`` too: a stale line would move
    nothing, and a renamed heavy test would silently come back into the fast tier."""
    from corpus_assets_tests.conftest import heavy_test_ids

    listed = heavy_test_ids()
    assert listed and listed <= _collected(_tier("SLOW_TIER"))


def test_doc_config_examples_are_valid() -> None:
    """Every YAML block in the README and docs/ parses as (a source list entry of) a valid
    corpus.yaml, so the examples users copy cannot drift from the config model."""
    blocks = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        blocks += [(path.name, b.split("```")[0]) for b in text.split("```yaml\n")[1:]]
    assert len(blocks) >= 5
    for name, block in blocks:
        raw = yaml.safe_load(block if "version:" in block else "sources:\n" + block)
        raw.setdefault("version", 1)
        raw.setdefault("purpose", "readme")
        parse_config(raw, name)


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
LONG_FUNCTION_MARK = "# long function:"  # followed by why (a tight loop, say)


def test_core_modules_and_functions_stay_short() -> None:
    """A module reads at once under ~450 lines and a function under ~60; a longer function
    must say why inside it (``# long function: ...``)."""
    offenders = []
    for path in sorted((REPO / "corpus_assets" / "core").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(REPO).as_posix()
        lines = text.splitlines()
        if len(lines) > MAX_MODULE_LINES:
            offenders.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = node.end_lineno - node.lineno + 1
            body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if length > MAX_FUNCTION_LINES and LONG_FUNCTION_MARK not in body:
                offenders.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert offenders == []


# Tests of the project as a whole (its files, docs, packaging, deployment, a process's allocators
# and garbage collection)
# sit at the top; every other test sits in the folder of the package it tests.
PROJECT_TESTS = {
    "test_compose.py",
    "test_deploy_k8s.py",
    "test_docs.py",
    "test_gc_threshold.py",
    "test_native_services.py",
    "test_packaging.py",
    "test_repository.py",
    "test_returning_allocators.py",
}


def test_the_test_tree_mirrors_the_package_tree() -> None:
    tests = REPO / "corpus_assets_tests"
    misplaced = []
    for test in sorted(tests.rglob("test_*.py")):
        folder = test.parent.relative_to(tests)
        if folder == folder.parent:  # the top
            ok = test.name in PROJECT_TESTS
        else:
            ok = (REPO / "corpus_assets" / folder / "__init__.py").is_file() and (
                test.parent / "__init__.py"
            ).is_file()
        if not ok:
            misplaced.append(str(test.relative_to(REPO)))
    assert misplaced == [], f"not beside a package of corpus_assets: {misplaced}"


def test_no_file_cites_a_document_outside_the_repository() -> None:
    """The design seeds and the issue tracker are not in the repository: a comment or doc says
    the rule itself instead of citing a seed by number or an issue by number."""
    cites = re.compile(r"\b(" + "seed" + r" ?0\d\d|" + "issue" + r" ?#?\d+)\b", re.IGNORECASE)
    tracked = subprocess.run(
        ["git", "ls-files", "corpus_assets", "corpus_assets_tests", "bench", "docs", "deploy"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for name in [*tracked, "README.md", "Makefile", "pyproject.toml"]:
        path = REPO / name
        if path.suffix in {".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt", ""}:
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if cites.search(line):
                    found.append(f"{name}:{number}: {line.strip()[:80]}")
    assert found == [], "\n".join(found)
