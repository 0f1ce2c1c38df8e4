"""Backbone registry: a name → a factory ``build(**options) -> Backbone``, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any

from .base import Backbone, Cond, VelocityFn, cat_cond, index_cond

# name → "module:factory". Modules are imported only when the backbone is built, so that a user of one
# backbone never pays for (or needs the optional dependencies of) another.
BACKBONES: dict[str, str] = {
    "linear-toy": "jagg_engine.backbones.linear_toy:LinearToy",
    "tiny-flux": "jagg_engine.backbones.flux_core:TinyFlux",
    "bench-flux": "jagg_engine.bench:BenchFlux",
    "tiny-shapes": "jagg_engine.backbones.tiny_shapes:build",
    "flux": "jagg_engine.backbones.flux:build",
    "qwen-image": "jagg_engine.backbones.qwen_image:build",
    "sd3": "jagg_engine.backbones.sd3:build",
}


class BackboneConfigError(ValueError):
    """Unknown backbone, bad option or missing weights; the message is one line."""


def build_backbone(name: str, **options: Any) -> Backbone:
    if name not in BACKBONES:
        raise BackboneConfigError(f"backbone: unknown backbone {name!r}; allowed: {', '.join(BACKBONES)}")
    module, factory = BACKBONES[name].split(":")
    return getattr(importlib.import_module(module), factory)(**options)


__all__ = [
    "BACKBONES",
    "Backbone",
    "BackboneConfigError",
    "Cond",
    "VelocityFn",
    "build_backbone",
    "cat_cond",
    "index_cond",
]
