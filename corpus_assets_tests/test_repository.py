"""Promises about the repository itself: layering, the front door, the instance config."""

import ast
import tomllib
from pathlib import Path

import yaml

from corpus_assets.core.runtime.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_every_core_stage_is_in_the_layering_contract() -> None:
    """`lint-imports` (run by `make test`) only guards the stages it names: a new subpackage of
    core must take its place in the layers, or it could import anything."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers")["layers"]
    layered = [m.strip() for layer in layers for m in layer.split("|")]  # "a | b": siblings
    core = ROOT / "corpus_assets" / "core"
    stages = {p.name for p in core.iterdir() if (p / "__init__.py").is_file()}
    stages |= {p.stem for p in core.glob("*.py") if p.stem != "__init__"}
    assert sorted(layered) == sorted(f"corpus_assets.core.{s}" for s in stages)
    forbidden = {m for c in contracts["contracts"] for m in c.get("forbidden_modules", [])}
    assert {"dagster", "corpus_assets.assets", "corpus_assets.cli"} <= forbidden


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme.split("## Open the UI")[0]
    assert "\nmake test\n" in ci


def test_doc_config_examples_are_valid() -> None:
    """Every YAML block in the README and docs/ parses as (a source list entry of) a valid
    corpus.yaml, so the examples users copy cannot drift from the config model."""
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
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
    for path in sorted((ROOT / "corpus_assets" / "core").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
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
