"""YAML for ``corpus.yaml``: safe loading that refuses a key repeated in one mapping."""

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
