"""The one YAML loader for everything a user hands the project: config files, ``key=value`` overrides (the CLI's
and the app's overrides box) and accelerate config files.

PyYAML's ``safe_load`` builds no Python objects, but it still expands aliases (a 439-byte "billion laughs"
line grows to gigabytes), lets the last of two equal keys win silently, and recurses once per nesting level (a
deep ``[[[[…]]]]`` ends in a RecursionError). :func:`load` refuses all of it before anything is built, each with
one line naming ``where`` and what is allowed:

* **size**: at most ``max_bytes`` of text; a file is measured (``stat``, then at most ``max_bytes + 1`` bytes
  read) before a byte of it is parsed, so a 50 MB file costs no parse at all;
* **anchors and aliases** (``&a``, ``*a``) and merge keys (``<<``, which exist to merge aliases): refused at
  the first event that carries one, so nothing is ever expanded;
* **duplicate keys** in one mapping;
* **nesting** deeper than ``max_depth`` collections, counted while the document is composed (the parser
  and scanner keep their own stacks; only the composer recurses, and it stops at the limit).

Idea borrowed from the "billion laughs" defences of XML parsers (defusedxml: forbid entity declarations
rather than cap their expansion) and from ruamel.yaml's ``allow_duplicate_keys=False`` default.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

CONFIG_MAX_BYTES = 256 * 1024  # a config file (the shipped ones are under 4 KiB)
OVERRIDES_MAX_BYTES = 64 * 1024  # one key=value override, and the app's whole overrides box
MAX_DEPTH = 16  # nested lists/mappings (a config needs 3: reward_options.<reward>.<option>)


class YamlRefused(ValueError):
    """Text that is not accepted as YAML here; the message is one line."""


class YamlInvalid(YamlRefused):
    """Text that is not YAML at all (a syntax error)."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


class _Strict:
    """SafeLoader's composer and constructor without anchors, aliases, merge keys and duplicate keys, and
    with a nesting limit; mixed into a loader below."""

    max_depth = MAX_DEPTH
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, yaml.AliasEvent):
            raise YamlRefused(
                f"alias *{event.anchor} at {_where(event.start_mark)}: anchors and aliases are not allowed"
            )
        if getattr(event, "anchor", None):
            raise YamlRefused(
                f"anchor &{event.anchor} at {_where(event.start_mark)}: anchors and aliases are not allowed"
            )
        nested = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if nested:
            self._depth += 1
            if self._depth > self.max_depth:
                raise YamlRefused(
                    f"nesting deeper than {self.max_depth} lists/mappings at {_where(event.start_mark)}"
                )
        try:
            return Composer.compose_node(self, parent, index)  # type: ignore[arg-type]
        finally:
            if nested:
                self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlRefused(
                    f"merge key << at {_where(key_node.start_mark)}: merge keys are not allowed"
                )
            key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeConstructor refuses it below with its own message
                continue
            if duplicate:
                raise YamlRefused(
                    f"duplicate key {brief(key, 60)} at {_where(key_node.start_mark)}: each key may appear once"
                )
            seen.add(key)
        return SafeConstructor.construct_mapping(self, node, deep=deep)  # type: ignore[arg-type]


class _StrictLoader(_Strict, yaml.SafeLoader):
    """Pure Python: PyYAML's scanner, parser and composer."""


if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class _StrictCLoader(_Strict, Composer, CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """libyaml's scanner and parser (C: PyYAML's Python scanner looks up to 1024 characters ahead for a
        possible key at every "[", about 0.5 s on ``[[[…``), with the Python composer above, so that the
        checks run on each event as it comes."""

        def __init__(self, stream: str):
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)

    _LOADER: type = _StrictCLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADER = _StrictLoader


def brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error message never echoes a megabyte back."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load(text: str, where: str, max_bytes: int = CONFIG_MAX_BYTES, source: str | None = None) -> Any:
    """Parse ``text`` as one YAML document under the rules above; raise :class:`YamlRefused` (one line that
    starts with ``where``) otherwise, :class:`YamlInvalid` for a syntax error. ``source`` names the file."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise YamlRefused(f"{where}: {size:,} bytes is over the limit of {max_bytes:,} bytes")
    loader = _LOADER(text)
    try:
        return loader.get_single_data()
    except YamlRefused as exc:
        raise YamlRefused(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own limit (1000), met while scanning ahead
            at = getattr(exc, "problem_mark", None)
            raise YamlRefused(
                f"{where}: nesting deeper than {MAX_DEPTH} lists/mappings{f' at {_where(at)}' if at else ''}"
            ) from None
        what = f"{source} is not valid YAML" if source else "not valid YAML"
        raise YamlInvalid(f"{where}: {what}: {' '.join(str(exc).split())}") from None
    except RecursionError:  # never expected under max_depth; kept so that no traceback can escape
        raise YamlRefused(f"{where}: nesting too deep") from None
    finally:
        loader.dispose()


def read_text(path: str | os.PathLike[str], where: str, max_bytes: int = CONFIG_MAX_BYTES) -> str:
    """The UTF-8 text of ``path``, refused (:class:`YamlRefused`) past ``max_bytes`` before it is read whole;
    OSError and UnicodeDecodeError pass through for the caller's own message."""
    if os.stat(path).st_size > max_bytes:
        raise YamlRefused(
            f"{where}: {os.fspath(path)} is {os.stat(path).st_size:,} bytes, over the limit of {max_bytes:,} bytes"
        )
    with open(path, "rb") as f:  # a FIFO or /dev/zero reports size 0: read no more than the limit
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise YamlRefused(f"{where}: {os.fspath(path)} is over the limit of {max_bytes:,} bytes")
    return data.decode("utf-8")


def load_file(path: str | os.PathLike[str], where: str, max_bytes: int = CONFIG_MAX_BYTES) -> Any:
    """:func:`read_text` then :func:`load`."""
    return load(read_text(path, where, max_bytes), where, max_bytes, source=os.fspath(path))
