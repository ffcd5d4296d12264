"""A stage's code identity: the digest of the source it runs, so caches never outlive a fix.

Chunk tasks and layer indexes are keyed on it. It covers one module, every ``corpus_assets``
module it imports - transitively, found by parsing the source with ``ast`` (static: nothing is
imported or executed, and imports inside functions count too) - the packages' ``__init__.py``
files on the way, and ``uv.lock`` beside the package when present. Editing ``records/pii.py``
therefore changes the identity of every stage whose code imports it and of no other. Paths are
relative to the package's parent, so the same tree gives the same identity wherever it lives.
Results are cached per process, and stage modules take theirs at import (``CODE = stage_code(...)``)
so the digest describes the source the process loaded, not a file edited while a server runs.
Parsing is the cost (~0.3-0.9 CPU-s a process, every CLI command and Dagster process pays it at
import); two caches keyed by each file's sha256 spare it: a pool worker starts with its driver's
parses (``parsed_imports`` / ``seed_parsed_imports``), and every process reads and extends an
on-disk cache of what each file's source imports (``ParseCache``), so a process parses only
files whose bytes no earlier process saw. The cache holds the import statements as written, not
the closure: whether ``from pkg import name`` names a module is decided against the tree at
hand, so moving files around changes identities even where no file's bytes changed.

Not covered: imports built at run time (``importlib.import_module``; the package has none) and
non-Python data files; the transform image and the snapshotId still cover every ``.py`` file.
"""

import ast
import hashlib
import json
import os
import tempfile
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
    _parse_cache().save()
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
        is_package = path.name == "__init__.py"
        written = _parse_cache().imports(module, is_package, key[2], path, package_root)
        _PARSED[key] = _resolve(written, package_root)
    return _PARSED[key]


Written = tuple[tuple[str, ...], tuple[str, ...]]  # (modules imported, maybe-modules)


def _parse_imports(module: str, is_package: bool, path: Path, package_root: Path) -> Written:
    """The import statements of ``path`` as absolute names: the modules they import for sure
    and the ``base.name`` of each ``from base import name`` (a module only if a file has it)."""
    tree = ast.parse(path.read_bytes(), filename=_relative(path, package_root))
    modules: set[str] = set()
    maybe: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            modules.add(base)
            maybe.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return tuple(sorted(modules)), tuple(sorted(maybe))


def _resolve(written: Written, package_root: Path) -> tuple[str, ...]:
    """The package's modules among ``written``, against the files under ``package_root``."""
    package = package_root.name
    modules, maybe = written
    found = set(modules) | {n for n in maybe if _source(n, package_root) is not None}
    return tuple(sorted(n for n in found if n == package or n.startswith(package + ".")))


class ParseCache:
    """What each source file imports, by (module, is-package, sha256 of its bytes), in one JSON
    file shared by every process of the user (``CORPUS_CODE_CACHE`` or the XDG cache folder).
    Entries are written once parsed (atomically, merged with what other processes wrote); a
    missing, unreadable or malformed file is a cold cache, never an error."""

    SCHEMA = "corpus.import-parses.v1"
    LIMIT = 4096  # entries kept; past it, only those this process used (old edits age out)

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries = self._load()
        self.used: set[str] = set()
        self.pending = False

    def imports(
        self, module: str, is_package: bool, digest: str, path: Path, package_root: Path
    ) -> Written:
        key = f"{module}|{int(is_package)}|{digest}"
        self.used.add(key)
        found = self.entries.get(key)
        if found is None:
            found = _parse_imports(module, is_package, path, package_root)
            self.entries[key] = found
            self.pending = True
        return found

    def _load(self) -> dict[str, Written]:
        try:
            document = json.loads(self.path.read_bytes()) if self.path else {}
            if not isinstance(document, dict) or document.get("schema") != self.SCHEMA:
                return {}
            return {k: (tuple(v[0]), tuple(v[1])) for k, v in document["entries"].items()}
        except (OSError, ValueError, LookupError, AttributeError, TypeError):
            return {}

    def save(self) -> None:
        """Write what this process parsed, merged with entries other processes wrote since."""
        if self.path is None or not self.pending:
            return
        self.pending = False
        merged = {**self._load(), **self.entries}
        if len(merged) > self.LIMIT:
            merged = {k: v for k, v in merged.items() if k in self.used}
        document = {"schema": self.SCHEMA, "entries": {k: list(v) for k, v in merged.items()}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False) as out:
                json.dump(document, out, sort_keys=True)
            os.replace(out.name, self.path)
        except OSError:
            pass  # a read-only cache folder: this process parses, as without a cache


@cache
def _parse_cache() -> ParseCache:
    """The process's cache, at ``CORPUS_CODE_CACHE`` (``off`` for none) or the XDG cache."""
    setting = os.environ.get("CORPUS_CODE_CACHE")
    if setting == "off":
        return ParseCache(None)
    if setting:
        return ParseCache(Path(setting))
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home directory to find: no cache
        return ParseCache(None)
    return ParseCache(Path(base) / "corpus_assets" / "import-parses.v1.json")


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
    """``a/b.py`` or ``a/b/__init__.py`` for module ``a.b`` of the package (``a/b.py`` first)."""
    return _modules(package_root).get(module)


@cache
def _modules(package_root: Path) -> dict[str, Path]:
    """The package's modules by name, from one walk of its tree a process: each stage's closure
    asks after most of them again (~15 closures at import, ~1,100 names a process, most of
    them ``from x import name`` names that are not modules), and two ``stat`` calls a name
    had been a fifth of the identities' cost."""
    found: dict[str, Path] = {}
    for folder, folders, files in os.walk(package_root):
        folders[:] = [name for name in folders if name != "__pycache__"]
        base = Path(folder).relative_to(package_root.parent).parts
        for name in files:
            path = Path(folder, name)
            if name == "__init__.py" and path.is_file():
                found.setdefault(".".join(base), path)  # a sibling ``b.py`` comes first
            elif name.endswith(".py") and path.is_file():
                found[".".join((*base, name[:-3]))] = path
    return found


def _relative(path: Path, package_root: Path) -> str:
    """The path as hashed: relative to the package's parent, never absolute."""
    return path.relative_to(package_root.parent).as_posix()


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
