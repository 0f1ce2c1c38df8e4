"""What the registries share: lazy references to implementations, and user modules imported by name.

Torch-free, like the registries built on it (:mod:`jagg_engine.sde_kinds`, :mod:`jagg_engine.backbones`), so
that listing names (the app's dropdowns, a config's validation) imports no model code.

- A *reference* is either the object itself or a string ``"package.module:attribute"``; :func:`resolve`
  imports the module the first time the object is needed (a user of one backbone never pays for another's
  dependencies).
- A *plugin* is a module a config names in ``plugins: [my_pkg.my_sde, ...]``: :func:`import_plugins` imports
  it before the config is checked, in every process that checks it (the app, ``jagg train``, the trainer
  processes), so what it registers (an SDE kind, a reward, a backbone) is known by name everywhere.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

_RESOLVED: dict[str, Any] = {}


def resolve(ref: str | Callable[..., Any]) -> Any:
    """The object ``ref`` names: itself when it is not a string, else ``module:attribute`` imported (cached)."""
    if not isinstance(ref, str):
        return ref
    if ref not in _RESOLVED:
        module, _, attribute = ref.partition(":")
        if not module or not attribute:
            raise ValueError(f"reference: must be 'package.module:attribute', got {ref!r}")
        _RESOLVED[ref] = getattr(importlib.import_module(module), attribute)
    return _RESOLVED[ref]


# The registries a plugin adds to: (module, dict attribute, the attributes of an entry that hold its code).
_REGISTRIES = (
    ("jagg_engine.sde_kinds", "SDE_KINDS", ("step", "kl_step_size")),
    ("jagg_engine.backbones.registry", "BACKBONES", ("factory", "prompts")),
    ("jagg_engine.rewards.registry", "_REGISTRY", ("factory", "check")),
)
_PLUGINS: set[str] = set()  # modules import_plugins saw register something


def _entries() -> set[tuple[str, str, int]]:
    """(registry, name, id of the entry) of every entry of the registries imported so far."""
    found = set()
    for module, attribute, _ in _REGISTRIES:
        registry = getattr(sys.modules.get(module), attribute, None) or {}
        found |= {(attribute, key, id(value)) for key, value in list(registry.items())}
    return found


def _defines_entries(name: str) -> bool:
    """Whether an entry of a registry has its code in module ``name`` (or a submodule of it)."""
    for module, attribute, fields in _REGISTRIES:
        for entry in list((getattr(sys.modules.get(module), attribute, None) or {}).values()):
            for ref in (getattr(entry, f, None) for f in fields):
                where = ref.partition(":")[0] if isinstance(ref, str) else getattr(ref, "__module__", None)
                if where and (where == name or where.startswith(name + ".")):
                    return True
    return False


def import_plugins(modules: Sequence[str], field_name: str = "plugins") -> None:
    """Import each module of ``modules`` (dotted names on ``sys.path``) so that it registers what it defines.

    Raises ValueError with one line naming ``field_name`` and the module when a module cannot be imported,
    or when it registers nothing (no SDE kind, backbone or reward: ``plugins: [this]`` is a typo, not a
    plugin). A module already imported is not imported again; it must then hold the code of a registry entry.
    """
    for name in modules:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                f"{field_name}: each entry must be a module name like my_pkg.my_sde, got {name!r}"
            )
        if name in _PLUGINS:
            continue
        if name in sys.modules:
            if not _defines_entries(name):
                raise ValueError(_nothing(field_name, name))
            _PLUGINS.add(name)
            continue
        before = _entries()
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(
                f"{field_name}: cannot import {name!r} ({exc}); put its folder on PYTHONPATH"
            ) from None
        except (
            Exception
        ) as exc:  # a plugin's own error (a bad registration, a typo): one line, its cause kept
            text = " ".join(str(exc).split())[:200]
            raise ValueError(
                f"{field_name}: importing {name!r} failed: {type(exc).__name__}: {text}"
            ) from exc
        if _entries() == before and not _defines_entries(name):
            raise ValueError(_nothing(field_name, name))
        _PLUGINS.add(name)


def _nothing(field_name: str, name: str) -> str:
    return (
        f"{field_name}: {name!r} registers nothing (no SDE kind, backbone or reward); a plugin module calls"
        " register_sde, register_backbone or register_reward"
    )
