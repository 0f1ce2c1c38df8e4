"""Weight-free rewards: JPEG (in)compressibility and two colour statistics.

All take images (B, H, W, 3) uint8 on the CPU and return (B,) float32; prompts are ignored.

- ``jpeg_compressibility``: −(size of the JPEG at quality 95 in kB) · scale. DDPO (Black et al. 2023) uses
  −kB; Flow-GRPO divides it further by 500 (``scale=0.002``).
- ``jpeg_incompressibility``: +kB · scale.
- ``brightness``: mean luma in [0, 1] (ITU-R BT.601 weights 0.299 R + 0.587 G + 0.114 B).
- ``colorfulness``: Hasler & Süsstrunk (2003) M = σ_rgyb + 0.3·μ_rgyb on 0..255 channels, times ``scale``
  (default 1/100, so most images land in [0, 1.5]).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from .registry import RewardConfigError, register_reward


def _check_images(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(
            f"rewards expect uint8 images (B, H, W, 3), got {tuple(images.shape)} {images.dtype}"
        )


def jpeg_kilobytes(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """Size in kB (1000 bytes) of each image as a JPEG at ``quality``. (B, H, W, 3) uint8 → (B,) float32."""
    _check_images(images)
    sizes = []
    for img in images.numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


def _check_jpeg(scale: float = 1.0, quality: int = 95) -> None:
    if not 1 <= quality <= 100:
        raise RewardConfigError(f"reward.quality: JPEG quality must be in 1..100, got {quality}")
    if scale <= 0:
        raise RewardConfigError(f"reward.scale: must be > 0, got {scale}")


class JpegSize:
    """±kB of the JPEG · scale; ``sign=-1`` rewards compressible images."""

    def __init__(self, sign: float, scale: float = 1.0, quality: int = 95):
        self.sign, self.scale, self.quality = sign, scale, quality

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.sign * self.scale * jpeg_kilobytes(images, self.quality)


@register_reward(
    "jpeg_compressibility",
    check=_check_jpeg,
    help="−kB of the JPEG at quality 95 (DDPO); options scale, quality",
)
def jpeg_compressibility(scale: float = 1.0, quality: int = 95) -> JpegSize:
    return JpegSize(-1.0, scale, quality)


@register_reward(
    "jpeg_incompressibility", check=_check_jpeg, help="+kB of the JPEG at quality 95; options scale, quality"
)
def jpeg_incompressibility(scale: float = 1.0, quality: int = 95) -> JpegSize:
    return JpegSize(1.0, scale, quality)


def brightness_score(images: torch.Tensor) -> torch.Tensor:
    """Mean BT.601 luma in [0, 1]. (B, H, W, 3) uint8 → (B,) float32."""
    _check_images(images)
    weights = torch.tensor([0.299, 0.587, 0.114])
    return (images.float() @ weights).mean(dim=(1, 2)) / 255.0


def colorfulness_score(images: torch.Tensor) -> torch.Tensor:
    """Hasler & Süsstrunk (2003) colourfulness on 0..255 channels. (B, H, W, 3) uint8 → (B,) float32.

    rg = R − G, yb = (R + G)/2 − B;  M = sqrt(σ_rg² + σ_yb²) + 0.3·sqrt(μ_rg² + μ_yb²)  (population σ).
    """
    _check_images(images)
    x = images.double()
    r, g, b = x[..., 0], x[..., 1], x[..., 2]  # (B, H, W) each
    rg, yb = (r - g).flatten(1), ((r + g) / 2 - b).flatten(1)  # (B, H·W)
    std = torch.sqrt(rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False))
    mean = torch.sqrt(rg.mean(dim=1) ** 2 + yb.mean(dim=1) ** 2)
    return (std + 0.3 * mean).float()


class _Statistic:
    def __init__(self, fn, scale: float):
        self.fn, self.scale = fn, scale

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.scale * self.fn(images)


def _check_scale(scale: float = 1.0) -> None:
    if not np.isfinite(scale) or scale == 0:
        raise RewardConfigError(f"reward.scale: must be a finite non-zero number, got {scale}")


@register_reward(
    "brightness", check=_check_scale, help="mean luma in [0, 1] (BT.601); option scale (−1 = darkness)"
)
def brightness(scale: float = 1.0) -> _Statistic:
    return _Statistic(brightness_score, scale)


@register_reward(
    "colorfulness", check=_check_scale, help="Hasler–Süsstrunk colourfulness / 100; option scale"
)
def colorfulness(scale: float = 0.01) -> _Statistic:
    return _Statistic(colorfulness_score, scale)
