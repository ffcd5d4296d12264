"""YAML for ``corpus.yaml``: safe loading that refuses a key repeated in one mapping."""

import copy
import functools
from typing import Any

import yaml


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated mapping keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config_yaml(text: str) -> Any:
    """``text`` loaded with ``UniqueKeyLoader``, parsed once per process (the caller gets its
    own copy): a build opens its config ~20 times (each Dagster step's workspace, the trust
    root's lookups), and PyYAML's pure-Python parse was ~5 ms of each. ``load_config`` still
    reads the file every time, so an edit is seen at the next open."""
    return copy.deepcopy(_parsed(text))


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Any:
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
