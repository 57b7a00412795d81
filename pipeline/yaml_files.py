"""YAML files a person writes (a mapping, params.yaml, run configs, a sweep's space), read so that a mistake
is one line naming the file.

    content = load_yaml_file("params.yaml")     # YamlFileError: "params.yaml: key 'train' given twice (...)"

PyYAML keeps the last of two equal keys in one mapping without a word (a question named twice would train on
one of them), so a repeated key is refused with its line, as are bytes that are not UTF-8 and text that is not
YAML. Booleans and integers are read as YAML 1.2 reads them (`yes` and `007` stay text). A leaf: it imports
nothing from the project, so the data layer and `pipeline.config` both import it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """The file is not UTF-8 YAML, or gives a key twice in one mapping; the message names the file."""


class _RepeatedKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"key {key!r} given twice (the second at line {line}); give each key once")


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:  # a list or mapping as a key: the safe loader's own error says so below
            continue
        if repeated:
            raise _RepeatedKey(key, key_node.start_mark.line + 1)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)

# YAML 1.2's plain scalars, not PyYAML's YAML 1.1: `yes`, `no`, `on`, `off` and `NO` (Norway) stay text, as do
# `007` and `010` (1.1 reads them as octal 7 and 8), so labels listed as options are the labels the data
# holds.
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)


def load_yaml_file(path: str | Path) -> Any:
    """The file's YAML content (None for an empty file); YamlFileError, one line naming the file,
    otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise YamlFileError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _RepeatedKey as error:
        raise YamlFileError(f"{path}: {error}") from None
    except yaml.YAMLError as error:
        # One line, naming the file where the parser says "<unicode string>".
        said = " ".join(str(error).replace('"<unicode string>"', str(path)).split())
        raise YamlFileError(f"{path}: not YAML ({said})") from None
