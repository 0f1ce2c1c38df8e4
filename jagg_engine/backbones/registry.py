"""The backbone registry: one entry per backbone, carrying everything the rest of the code reads of it.

- the trainer builds it (:func:`build_backbone`) with the options its entry says it reads from the config
  (:attr:`BackboneSpec.options`, filled by :meth:`jagg_engine.train.config.TrainConfig.backbone_kwargs`);
- the config validator takes its allowed names from :data:`BACKBONES`, refuses a model field the backbone
  does not read (it would be silently ignored), checks a local ``model_path`` with ``model_folder``, and
  allows ``prompts_file: null`` only where ``procedural_prompts`` is set;
- ``jagg bench`` offers the backbones flagged ``bench``; the app lists those flagged ``in_app``.

An unknown name is an error, never a fallback. This module imports no torch: the factory is a reference
(``"module:attribute"``, imported when the backbone is built, so a user of one backbone never pays for another's
dependencies) or the factory itself. A new backbone is its adapter module plus one :func:`register_backbone`
call; a user's own module registers with the same call and is imported by the config's ``plugins``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..plugins import resolve


class BackboneConfigError(ValueError):
    """Unknown backbone, bad option or missing weights; the message is one line."""


@dataclass(frozen=True)
class ModelFolder:
    """What a local ``model_path`` folder of a backbone must hold, checked before training starts.

    missing:     ``missing(folder: Path) -> list[str]``, the files the folder lacks (a reference or function)
    what:        what the folder holds, for the message: "<backbone> <what>" ("flux pipeline")
    hint:        the end of the message, e.g. "; pass a diffusers pipeline folder"
    local_only:  model_path must be an existing folder (no hub id)
    """

    missing: str | Callable[..., list[str]]
    what: str
    hint: str = ""
    local_only: bool = False


@dataclass(frozen=True)
class BackboneSpec:
    """One backbone; see the module docstring.

    factory:             ``factory(**options) -> Backbone`` (a reference or the callable)
    options:             factory option → the config field it is read from ("(the trainer)" = set by the
                         trainer, e.g. the device); an option not listed is only set through backbone_options
    procedural_prompts:  trains without a prompts file, on ``prompts()`` or else generic text ("prompt 0", …)
    prompts:             ``prompts() -> list[str]``, the prompts of a procedural backbone (None: generic text)
    bench:               offered by ``jagg bench``
    in_app:              listed in the app's New-run form
    model_folder:        how a local model_path is checked (None: not checked)
    pipeline_schedule:   the backbone can take its sampling σ from its diffusers pipeline's scheduler
                         (``model.pipeline_sigmas(T)``); its default ``schedule`` is then "pipeline"
    """

    name: str
    factory: str | Callable[..., Any]
    options: Mapping[str, str] = field(default_factory=dict)
    procedural_prompts: bool = False
    prompts: str | Callable[[], list[str]] | None = None
    bench: bool = False
    in_app: bool = False
    model_folder: ModelFolder | None = None
    help: str = ""
    pipeline_schedule: bool = False

    def factory_fn(self) -> Callable[..., Any]:
        return resolve(self.factory)


BACKBONES: dict[str, BackboneSpec] = {}


def register_backbone(
    name: str,
    factory: str | Callable[..., Any],
    *,
    options: Mapping[str, str] | None = None,
    procedural_prompts: bool = False,
    prompts: str | Callable[[], list[str]] | None = None,
    bench: bool = False,
    in_app: bool = False,
    model_folder: ModelFolder | None = None,
    help: str = "",
    pipeline_schedule: bool = False,
) -> BackboneSpec:
    """Register (or replace) the backbone ``name``; returns its entry."""
    if not name or not isinstance(name, str):
        raise ValueError(f"backbone: a backbone needs a non-empty name, got {name!r}")
    spec = BackboneSpec(
        name,
        factory,
        dict(options or {}),
        procedural_prompts,
        prompts,
        bench,
        in_app,
        model_folder,
        help,
        pipeline_schedule,
    )
    BACKBONES[name] = spec
    return spec


def get_backbone(name: str) -> BackboneSpec:
    """The entry of ``name``; BackboneConfigError (one line, the allowed names) when it is not registered."""
    if name not in BACKBONES:
        raise BackboneConfigError(f"backbone: unknown backbone {name!r}; allowed: {', '.join(BACKBONES)}")
    return BACKBONES[name]


def build_backbone(name: str, **options: Any) -> Any:
    """Build the backbone ``name`` with ``options`` (its factory's keyword arguments)."""
    return get_backbone(name).factory_fn()(**options)


# The config fields every diffusers adapter reads (see jagg_engine.backbones.common.diffusers_factory).
DIFFUSERS_OPTIONS: dict[str, str] = {
    "model_path": "model_path",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_target_modules": "lora_targets",
    "gradient_checkpointing": "gradient_checkpointing",
    "reference_copy": "beta",
    "dtype": "precision",
    "device": "(the trainer)",
    "lora_path": "lora_path",
}
DIFFUSERS_FOLDER = ModelFolder(
    "jagg_engine.backbones.common:missing_pipeline_files", "pipeline", "; pass a diffusers pipeline folder"
)

register_backbone(
    "tiny-shapes",
    "jagg_engine.backbones.tiny_shapes:build",
    options={"weights_dir": "model_path", "cfg_scale": "cfg_scale"},
    procedural_prompts=True,
    prompts="jagg_engine.shapes_data:all_prompts",
    bench=True,
    in_app=True,
    model_folder=ModelFolder(
        "jagg_engine.backbones.tiny_shapes:missing_weight_files", "weights", local_only=True
    ),
    help="pixel-space FluxTransformer2DModel (2.3 M params) pretrained on 32×32 coloured shapes",
)
register_backbone(
    "flux",
    "jagg_engine.backbones.flux:build",
    options={**DIFFUSERS_OPTIONS, "guidance": "cfg_scale"},
    bench=True,
    in_app=True,
    model_folder=DIFFUSERS_FOLDER,
    help="FLUX.1 (diffusers FluxPipeline), LoRA or full fine-tuning",
    pipeline_schedule=True,
)
register_backbone(
    "qwen-image",
    "jagg_engine.backbones.qwen_image:build",
    options=DIFFUSERS_OPTIONS,
    in_app=True,
    model_folder=DIFFUSERS_FOLDER,
    help="Qwen-Image (diffusers QwenImagePipeline), LoRA or full fine-tuning",
    pipeline_schedule=True,
)
register_backbone(
    "sd3",
    "jagg_engine.backbones.sd3:build",
    options={**DIFFUSERS_OPTIONS, "cfg_scale": "cfg_scale"},
    in_app=True,
    model_folder=DIFFUSERS_FOLDER,
    help="Stable Diffusion 3 / 3.5 (diffusers StableDiffusion3Pipeline), LoRA or full fine-tuning",
    pipeline_schedule=True,
)
register_backbone(
    "tiny-flux",
    "jagg_engine.backbones.flux_core:TinyFlux",
    procedural_prompts=True,
    bench=True,
    in_app=True,
    help="a FluxTransformer2DModel from a small config, seeded random weights (smoke tests)",
)
register_backbone(
    "bench-flux",
    "jagg_engine.backbones.flux_core:BenchFlux",
    bench=True,
    help="tiny-flux at 2.3 M parameters and 256 tokens, large enough for timings",
)
register_backbone(
    "linear-toy",
    "jagg_engine.backbones.linear_toy:LinearToy",
    procedural_prompts=True,
    help="v = A·z + θ_0 + t·θ_1 (float64), the Theorem 1 field",
)
register_backbone(
    "mode-toy",
    "jagg_engine.backbones.mode_toy:build",
    options={"weights": "model_path"},
    procedural_prompts=True,
    prompts="jagg_engine.backbones.mode_toy:all_prompts",
    help="an MLP flow (37 k params) over 8-D points, 4 modes per prompt: GRPO on a CPU in seconds",
)
register_backbone(
    "gauss-toy",
    "jagg_engine.backbones.gauss_toy:GaussToy",
    procedural_prompts=True,
    help="the exact flow velocity of Gaussian data (+ a trained offset): rollout marginals in closed form",
)
