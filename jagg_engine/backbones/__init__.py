"""Backbones: one protocol (:mod:`.base`), one registry (:mod:`.registry`), one adapter module per model.

Importing this package imports no torch (the registry names its factories by reference); the protocol and
the conditioning helpers are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import (
    BACKBONES,
    DIFFUSERS_FOLDER,
    DIFFUSERS_OPTIONS,
    BackboneConfigError,
    BackboneSpec,
    ModelFolder,
    build_backbone,
    get_backbone,
    register_backbone,
)

_FROM_BASE = ("Backbone", "Cond", "VelocityFn", "cat_cond", "index_cond")


def __getattr__(name: str) -> Any:
    if name in _FROM_BASE:  # torch: only when asked for
        return getattr(importlib.import_module(f"{__name__}.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKBONES",
    "DIFFUSERS_FOLDER",
    "DIFFUSERS_OPTIONS",
    "Backbone",
    "BackboneConfigError",
    "BackboneSpec",
    "Cond",
    "ModelFolder",
    "VelocityFn",
    "build_backbone",
    "cat_cond",
    "get_backbone",
    "index_cond",
    "register_backbone",
]
