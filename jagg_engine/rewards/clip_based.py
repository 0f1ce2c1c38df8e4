"""Rewards from a CLIP-style dual encoder (transformers ``CLIPModel`` + ``CLIPProcessor``).

- ``pickscore``: PickScore (Kirstain et al. 2023), exp(logit_scale) · cos(image, text), divided by 26 as
  Flow-GRPO does so that typical scores sit near 0.8–0.9. Defaults as in Flow-GRPO: processor
  ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``, model ``yuvalkirstain/PickScore_v1``.
- ``clipscore``: 100 · max(cos(image, text), 0), the "CLIP score" convention of torchmetrics (Hessel et al.
  2021 use 2.5 · max(cos, 0); pass ``scale=0.025`` for that). Default model ``openai/clip-vit-large-patch14``.

Both take ``model`` (a local folder or hub id; the processor comes from the same place unless ``processor``
is given), ``device``, ``batch_size`` and ``scale``. ``check`` verifies that local folders hold the files and,
with ``HF_HUB_OFFLINE=1``, that hub ids are in the local cache, without loading anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ..devices import resolve_device
from .registry import RewardConfigError, register_reward

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
CLIPSCORE_MODEL = "openai/clip-vit-large-patch14"

MODEL_FILES = ("config.json",)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


def _looks_local(source: str) -> bool:
    return Path(source).expanduser().exists() or source.startswith(("/", ".", "~"))


def check_source(reward: str, option: str, source: str, files: Sequence[str]) -> None:
    """Raise a one-line RewardConfigError if ``source`` cannot provide one of ``files``; loads nothing.

    A local folder must contain one of ``files``. A hub id is only checked when the hub is off
    (``HF_HUB_OFFLINE=1``): then one of the files must already be in the local hub cache.
    """
    hint = f"pass {option}=/path/to/folder (a local copy) or a reachable hub id"
    if _looks_local(source):
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise RewardConfigError(f"{reward}: {option} folder {source!r} does not exist; {hint}")
        if not any((folder / f).is_file() for f in files):
            raise RewardConfigError(
                f"{reward}: {option} folder {source!r} has none of {', '.join(files)}; {hint}"
            )
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        from huggingface_hub import try_to_load_from_cache

        if not any(isinstance(try_to_load_from_cache(source, f), str) for f in files):
            raise RewardConfigError(
                f"{reward}: {option} {source!r} is not in the hub cache and HF_HUB_OFFLINE=1; {hint}"
            )


def clip_embeddings(
    model: torch.nn.Module,
    pixel_values: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-norm image and text embeddings of a transformers CLIPModel. → (B, D), (B, D).

    Calls the towers and projections directly (the same in transformers 4 and 5, whose
    ``get_*_features`` return types differ).
    """
    img = model.visual_projection(model.vision_model(pixel_values=pixel_values).pooler_output)  # (B, D)
    txt = model.text_projection(
        model.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
    )
    return torch.nn.functional.normalize(img.float(), dim=-1), torch.nn.functional.normalize(
        txt.float(), dim=-1
    )


class ClipSimilarity:
    """score_i = scale · f(cos(image_i, text_i)) with f set by ``kind``: 'pickscore' or 'clipscore'."""

    def __init__(
        self, kind: str, model: str, processor: str, device: str | None, batch_size: int, scale: float
    ):
        from transformers import CLIPModel, CLIPProcessor

        self.kind, self.scale, self.batch_size = kind, scale, batch_size
        self.device = resolve_device(device)
        self.processor = CLIPProcessor.from_pretrained(processor)
        self.model = CLIPModel.from_pretrained(model).to(self.device).eval().requires_grad_(False)
        self.max_length = self.model.config.text_config.max_position_embeddings

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """images (B, H, W, 3) uint8, B prompts → (B,) float32."""
        scores = []
        for i in range(0, images.shape[0], self.batch_size):
            imgs = list(images[i : i + self.batch_size].numpy())
            inputs = self.processor(images=imgs, return_tensors="pt")
            text = self.processor(
                text=list(prompts[i : i + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            img, txt = clip_embeddings(
                self.model,
                inputs["pixel_values"].to(self.device, self.model.dtype),
                text["input_ids"].to(self.device),
                text["attention_mask"].to(self.device),
            )
            cos = (img * txt).sum(-1)  # (b,)
            if self.kind == "pickscore":
                scores.append(self.model.logit_scale.exp().float() * cos)
            else:
                scores.append(100.0 * cos.clamp(min=0))
        return (self.scale * torch.cat(scores)).float().cpu()


def _sources(
    model: str, processor: str | None, default_model: str, default_processor: str
) -> tuple[str, str]:
    if processor is None:
        processor = default_processor if model == default_model else model
    return model, processor


def _check(reward: str, default_model: str, default_processor: str):
    def check(
        model: str = default_model,
        processor: str | None = None,
        device: str | None = None,
        batch_size: int = 16,
        scale: float = 1.0,
    ) -> None:
        if batch_size < 1:
            raise RewardConfigError(f"{reward}.batch_size: must be >= 1, got {batch_size}")
        model, processor = _sources(model, processor, default_model, default_processor)
        check_source(reward, "model", model, MODEL_FILES)
        check_source(reward, "processor", processor, PROCESSOR_FILES)

    return check


@register_reward(
    "pickscore",
    check=_check("pickscore", PICKSCORE_MODEL, PICKSCORE_PROCESSOR),
    help="PickScore (exp(logit_scale)·cos / 26, as Flow-GRPO); options model, processor, device, batch_size",
)
def pickscore(
    model: str = PICKSCORE_MODEL,
    processor: str | None = None,
    device: str | None = None,
    batch_size: int = 16,
    scale: float = 1 / 26,
) -> ClipSimilarity:
    model, processor = _sources(model, processor, PICKSCORE_MODEL, PICKSCORE_PROCESSOR)
    return ClipSimilarity("pickscore", model, processor, device, batch_size, scale)


@register_reward(
    "clipscore",
    check=_check("clipscore", CLIPSCORE_MODEL, CLIPSCORE_MODEL),
    help="100·max(cos(image, text), 0) with a CLIP model; options model, processor, device, scale",
)
def clipscore(
    model: str = CLIPSCORE_MODEL,
    processor: str | None = None,
    device: str | None = None,
    batch_size: int = 16,
    scale: float = 1.0,
) -> ClipSimilarity:
    model, processor = _sources(model, processor, CLIPSCORE_MODEL, CLIPSCORE_MODEL)
    return ClipSimilarity("clipscore", model, processor, device, batch_size, scale)
