"""A stage's code identity: the digest of the source it runs, so caches never outlive a fix.

Chunk tasks and layer indexes are keyed on it. It covers one module, every ``corpus_assets``
module it imports - transitively, found by parsing the source with ``ast`` (static: nothing is
imported or executed, and imports inside functions count too) - the packages' ``__init__.py``
files on the way, and ``uv.lock`` beside the package when present. Editing ``records/pii.py``
therefore changes the identity of every stage whose code imports it and of no other. Paths are
relative to the package's parent, so the same tree gives the same identity wherever it lives.
Results are cached per process, and stage modules take theirs at import (``CODE = stage_code(...)``)
so the digest describes the source the process loaded, not a file edited while a server runs.
Parsing is the cost (~0.3 CPU-s a process); a pool worker starts with its driver's parses
(``parsed_imports`` / ``seed_parsed_imports``), keyed by each file's sha256, so it parses only
a file whose bytes differ from what the driver parsed.

Not covered: imports built at run time (``importlib.import_module``; the package has none) and
non-Python data files; the transform image and the snapshotId still cover every ``.py`` file.
"""

import ast
import hashlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from corpus_assets.core.runtime.transform import PACKAGE_ROOT
from corpus_assets.core.storage.digests import json_digest

IDENTITY_SCHEMA = "corpus.code-identity.v1"


class CodeIdentityError(LookupError):
    """A module named for a code identity, or imported by one, has no source in the package."""


def stage_code(name: str, module: str, package_root: Path = PACKAGE_ROOT) -> str:
    """``<name>@sha256:<hex>``: the readable stage name for humans, the identity for caches."""
    return f"{name}@{code_identity(module, package_root)}"


@cache
def code_identity(module: str, package_root: Path = PACKAGE_ROOT) -> str:
    """``sha256:<hex>`` over (relative path, sha256) of ``module``'s import closure + uv.lock."""
    package_root = package_root.resolve()
    files = sorted(_closure(module, package_root))
    entries = [[path, _file_digest(package_root.parent / path)] for path in files]
    lock = package_root.parent / "uv.lock"
    if lock.is_file():
        entries.append(["uv.lock", _file_digest(lock)])
    return json_digest({"schema": IDENTITY_SCHEMA, "module": module, "files": entries})


def _closure(module: str, package_root: Path) -> set[str]:
    """Relative posix paths of ``module``, its ancestor packages and everything they import."""
    package = package_root.name
    if module != package and not module.startswith(package + "."):
        raise CodeIdentityError(f"{module!r} is not a module of the {package!r} package")
    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = _source(name, package_root)
        if path is None:
            raise CodeIdentityError(f"module {name!r} has no source under {package_root}")
        found[name] = path
        todo.extend(_parents(name))
        todo.extend(_imports(name, path, package_root))
    return {_relative(path, package_root) for path in found.values()}


def _parents(module: str) -> list[str]:
    """The packages Python imports (and runs ``__init__.py`` of) before ``module``."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


ParsedImports = dict[tuple[str, str, str], tuple[str, ...]]
_PARSED: ParsedImports = {}  # (module, package root, file sha256) -> the modules it imports


def parsed_imports() -> ParsedImports:
    """This process's parses, for a worker it starts (``seed_parsed_imports``)."""
    return dict(_PARSED)


def seed_parsed_imports(parsed: ParsedImports) -> None:
    """Take a driver's parses: a file is parsed again only if its bytes differ (sha256)."""
    _PARSED.update(parsed)


def _imports(module: str, path: Path, package_root: Path) -> tuple[str, ...]:
    """The package's modules ``module`` imports, anywhere in its source (sorted, unique)."""
    key = (module, str(package_root), _file_digest(path))
    if key not in _PARSED:
        _PARSED[key] = _parse_imports(module, path, package_root)
    return _PARSED[key]


def _parse_imports(module: str, path: Path, package_root: Path) -> tuple[str, ...]:
    package = package_root.name
    tree = ast.parse(path.read_bytes(), filename=_relative(path, package_root))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            found.add(base)
            for alias in node.names:  # ``from pkg import mod`` imports the module mod
                candidate = f"{base}.{alias.name}"
                if alias.name != "*" and _source(candidate, package_root) is not None:
                    found.add(candidate)
    return tuple(sorted(n for n in found if n == package or n.startswith(package + ".")))


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")  # fields holding statements


def _statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement, at any depth (function, class, if, try, with, loop and match bodies):
    an import is a statement, so the expressions - most of a tree - need not be walked."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.stmt):
            yield node
        for name in _BLOCKS:
            block = getattr(node, name, None)
            if isinstance(block, list):  # a lambda's or an IfExp's body is one expression
                todo.extend(block)


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    """The absolute module name of an import, resolving ``from .x import y`` forms."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, *([name] if name else [])])


def _source(module: str, package_root: Path) -> Path | None:
    """``a/b.py`` or ``a/b/__init__.py`` for module ``a.b``, looked up under the package root."""
    base = package_root.parent.joinpath(*module.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _relative(path: Path, package_root: Path) -> str:
    """The path as hashed: relative to the package's parent, never absolute."""
    return path.relative_to(package_root.parent).as_posix()


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
