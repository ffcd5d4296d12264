"""Promises about the repository itself: layering, the front door, the instance config."""

import ast
from pathlib import Path

import yaml

from corpus_assets.cli import DAGSTER_YAML
from corpus_assets.core.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_core_never_imports_dagster() -> None:
    offenders = []
    for path in sorted((ROOT / "corpus_assets" / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "dagster"]
    assert offenders == []


def test_cli_writes_the_repository_dagster_yaml() -> None:
    assert yaml.safe_load(DAGSTER_YAML) == yaml.safe_load((ROOT / "dagster.yaml").read_text())


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme.split("## Open the UI")[0]
    assert "\nmake test\n" in ci


def test_readme_config_examples_are_valid() -> None:
    """Every YAML block in the README parses as (a source list entry of) a valid corpus.yaml."""
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```yaml\n")[1:]
    assert len(blocks) >= 5
    for block in (b.split("```")[0] for b in blocks):
        raw = yaml.safe_load(block if "version:" in block else "sources:\n" + block)
        raw.setdefault("version", 1)
        raw.setdefault("purpose", "readme")
        parse_config(raw, "README.md")
