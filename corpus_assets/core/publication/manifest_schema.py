"""The JSON Schema (2020-12) of ``training.dataset.snapshot.v1``, shipped in the package.

``schema_errors`` lists every violation as ``<path>: <reason>`` (``members.count: ...``,
``sources[1].cdcHighWatermark: ...``, ``$`` for the document itself), sorted, so a consumer in
another language can check the same contract with the same file. Integers are strict: a float
with a zero fraction (``3.0``) is not an integer here, because hashed JSON refuses floats.
"""

import json
from collections.abc import Iterable
from functools import cache
from importlib.resources import files
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend

SCHEMA_FILE = "training.dataset.snapshot.v1.schema.json"
MAX_MESSAGE = 240


def schema() -> dict[str, Any]:
    """The schema document, read from the installed package."""
    return json.loads(_schema_text())


@cache
def _schema_text() -> str:
    return files("corpus_assets").joinpath("schemas", SCHEMA_FILE).read_text(encoding="utf-8")


def _is_strict_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)


@cache
def _validator() -> Draft202012Validator:
    """The shipped schema's validator. The schema is not checked against the 2020-12 metaschema
    here (~0.03 CPU-s in every process that verifies a manifest, each build's check among them):
    it is a file of the package, and the test suite checks it so."""
    return _StrictValidator(schema())


def schema_errors(manifest: Any) -> list[str]:
    """Every schema violation of ``manifest`` as ``<json path>: <reason>``; empty when valid."""
    found: list[tuple[list[str], str]] = []
    for error in _validator().iter_errors(manifest):
        found.extend(_describe(error))
    return [f"{_path(where)}: {why}" for where, why in sorted(set(map(_freeze, found)))]


def _freeze(item: tuple[list[str], str]) -> tuple[tuple[str, ...], str]:
    return tuple(item[0]), item[1]


def _describe(error: ValidationError) -> Iterable[tuple[list[str], str]]:
    where = [_step(p) for p in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        for key in error.validator_value:
            if key not in error.instance and repr(key) in error.message:
                yield [*where, _step(key)], "required key is missing"
        return
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties", {}))
        if error.validator_value is False:
            for key in sorted(set(error.instance) - known):
                yield [*where, _step(key)], "key is not allowed here"
            return
    message = error.message
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    yield where, message


def _step(part: Any) -> str:
    return f"[{part}]" if isinstance(part, int) else str(part)


def _path(steps: Iterable[str]) -> str:
    out = ""
    for step in steps:
        out += step if step.startswith("[") or not out else "." + step
    return out or "$"
