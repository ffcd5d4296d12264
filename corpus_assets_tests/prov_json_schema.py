"""The W3C PROV-JSON schema (vendored, see data/README.md) as a test helper: every PROV-JSON
document we emit must validate against it, not merely parse with the ``prov`` package."""

import json
from functools import cache
from typing import Any

from jsonschema import Draft4Validator

from corpus_assets_tests.paths import DATA

SCHEMA_PATH = DATA / "prov-json.schema.json"


@cache
def validator() -> Draft4Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    Draft4Validator.check_schema(schema)
    return Draft4Validator(schema, format_checker=Draft4Validator.FORMAT_CHECKER)


def schema_errors(document: dict[str, Any]) -> list[str]:
    """Each violation as "<path>: <message>"; empty when the document is valid PROV-JSON."""
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    ]
