"""Typed parsing of config values: the one parser YAML values, stored JSON and ``key=value`` overrides go
through, and the check of a factory's keyword options (``backbone_options``, ``reward_options``) against its
signature. Every refusal is a :class:`ConfigError` with one line naming the field and what is allowed.

Nothing here knows the fields of :class:`jagg_engine.train.config.TrainConfig`: each function is given the
field's name and type annotation.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

from jagg_engine import safe_yaml

# Every integer field lies in [low, high]; the defaults are 0 and INT_MAX (2^31 − 1: a seed, a count or a size
# beyond it is a typo, and 64-bit arithmetic on it — seeds × steps — cannot overflow).
INT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A bad config value; the message is one line naming the field and what is allowed."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


_brief = safe_yaml.brief


def _split_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    base, optional = _split_optional(tp)
    name = getattr(base, "__name__", str(base)) if typing.get_origin(base) is None else str(base)
    return name + (" | None" if optional else "")


def _parse_text(key: str, tp: Any, text: str) -> Any:
    """An override's text → a Python value, before type coercion."""
    base, optional = _split_optional(tp)
    if optional and text.strip().lower() in ("null", "none", "~"):
        return None
    if base is str:
        return text
    if typing.get_origin(base) in (list, dict):
        try:
            return safe_yaml.load(text, key, max_bytes=safe_yaml.OVERRIDES_MAX_BYTES)
        except safe_yaml.YamlInvalid:
            raise ConfigError(f"{key}: {_expected(base)} written in YAML, got {_brief(text)}") from None
        except safe_yaml.YamlRefused as exc:
            raise ConfigError(_one_line(str(exc))) from None
    return text.strip()


def _expected(tp: Any) -> str:
    base, _ = _split_optional(tp)
    origin = typing.get_origin(base)
    if origin is list:
        return "must be a list"
    if origin is dict:
        return "must be a mapping"
    return f"must be {'an' if base is int else 'a'} {_type_name(base)}"


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Parse ``value`` (from YAML, JSON or an override) as ``tp``; raise a one-line ConfigError."""
    base, optional = _split_optional(tp)
    if value is None:
        if optional or base is Any:  # Any: a reward's or backbone's option, checked against its factory
            return None
        raise ConfigError(f"{key}: must not be null")
    where = f"{key}: {_expected(tp)}{' or null' if optional else ''}, got {_brief(value)}"
    origin = typing.get_origin(base)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where)
        (item,) = typing.get_args(base)
        return [_coerce(f"{key}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where)
        _, vtype = typing.get_args(base)
        return {str(k): _coerce(f"{key}.{k}", vtype, v) for k, v in value.items()}
    if base is Any:
        return value
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ConfigError(f"{key}: must be true or false, got {_brief(value)}")
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(where)
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(where)
    if base is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where)
    raise ConfigError(f"{key}: unsupported field type {tp}")  # a new field type needs a branch here


def check_options(
    where: str, factory: Any, options: dict[str, Any], reserved: dict[str, str] | None = None
) -> None:
    """Check ``options`` against the keyword parameters of ``factory`` (a function or a class) before it is
    called: unknown names, options a config field sets (``reserved``: option → field) and values of the wrong
    type for the parameter's annotation raise a one-line ConfigError ``<where>.<option>: …``."""
    reserved = reserved or {}
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve here: check names only
        hints = {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = {n: p for n, p in sig.parameters.items() if p.kind in kinds}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    allowed = sorted(n for n in params if n not in reserved)
    for key, value in options.items():
        if key in reserved:
            field_name = reserved[key]
            hint = "it is set by the trainer" if field_name.startswith("(") else f"set the field {field_name}"
            raise ConfigError(f"{where}.{key}: not allowed here; {hint}")
        if key not in params:
            if open_ended:
                continue
            raise ConfigError(f"{where}.{key}: unknown option; allowed: {', '.join(allowed) or '(none)'}")
        tp = hints.get(key)
        if tp is not None and not _matches(value, tp):
            raise ConfigError(f"{where}.{key}: must be {_describe(tp)}, got {_brief(value)}")
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in options and name not in reserved:
            raise ConfigError(f"{where}.{name}: required option is missing")


def _matches(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits an annotation (bool is not an int; an int is a float; lists are sequences)."""
    if tp is Any or tp is object:
        return True
    if tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT_MAX
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str or tp is os.PathLike or tp is Path:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # an annotation this checker does not know: the factory checks it


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        return "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if tp in names:
        return names[tp]
    return f"a {getattr(tp, '__name__', str(tp))}"
