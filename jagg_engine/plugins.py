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


def import_plugins(modules: Sequence[str], field_name: str = "plugins") -> None:
    """Import each module of ``modules`` (dotted names on ``sys.path``) so that it registers what it defines.

    Raises ValueError with one line naming ``field_name`` and the module when a module cannot be imported;
    a module already imported is not imported again.
    """
    for name in modules:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                f"{field_name}: each entry must be a module name like my_pkg.my_sde, got {name!r}"
            )
        if name in sys.modules:
            continue
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
