"""Promises about the documentation: a short README, links that resolve, and no citation of a
document a reader cannot open (a comment or doc states the rule itself)."""

import ast
import io
import re
import tokenize
from pathlib import Path

from corpus_assets_tests.paths import REPO

README_MAX_LINES = 300
DOCS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE_DIRS = ("corpus_assets", "corpus_assets_tests", "bench")
# A numbered design seed, a tracker issue by number or a section sign: none is in the
# repository, so a reader cannot follow it.
CITATION = re.compile(r"\b[Ss]eeds? 0\d\d\b|\b[Ss]eed0\d\d\b|\b[Ii]ssues? \d+\b|§")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def test_readme_stays_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def slugs(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats
    numbered."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", markdown).splitlines():
        if match := re.match(r"#{1,6} (.*)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(path: Path) -> list[str]:
    """Relative links of one Markdown file whose file, or heading in a Markdown file, is
    missing."""
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        name = f"{path.relative_to(REPO)}: {target}"
        if not resolved.exists():
            broken.append(f"{name} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved.read_text()):
            broken.append(f"{name} (no such heading)")
    return broken


def test_relative_links_in_the_docs_resolve() -> None:
    assert [b for path in DOCS for b in broken_links(path)] == []


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """Every comment and docstring of a module, with its line number."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    scopes = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(ast.parse(source)):
        docstring = ast.get_docstring(node, clean=False) if isinstance(node, scopes) else None
        if docstring is not None:
            found.append((node.body[0].lineno, docstring))
    return found


def citations() -> list[str]:
    """Where a doc, comment or docstring cites a seed document, an issue or a section sign."""
    hits = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            hits += [f"{path.relative_to(REPO)}:{number}: {m}" for m in CITATION.findall(line)]
    for folder in CODE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for number, text in comments_and_docstrings(path.read_text()):
                name = path.relative_to(REPO)
                hits += [f"{name}:{number}: {m}" for m in CITATION.findall(text)]
    return hits


def test_no_doc_or_comment_cites_a_document_outside_the_repository() -> None:
    assert citations() == []
