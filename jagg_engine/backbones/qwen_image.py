"""`qwen-image`: Qwen-Image (diffusers QwenImagePipeline) as a Backbone, with LoRA on the transformer.

Latents are packed 2×2 patches as in Flux: z : (B, N, 4C), N = (H/16)·(W/16). The transformer takes the flow
time σ ∈ [0, 1] directly (the pipeline divides its 0..1000 timesteps by 1000), the per-sample image grid as
``img_shapes`` (no batch tensor, so it lives on the adapter) and a text padding mask.

cond = {"prompt_embeds": (B, L, D_joint), "prompt_embeds_mask": (B, L) int64, 1 = real token}. The pipeline's
``encode_prompt`` pads to the longest prompt of the call and drops the mask when nothing is padded; here the
mask is always present and, with ``text_pad_to``, every call pads to the same L so that conds encoded
separately can be concatenated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import BackboneConfigError
from .base import Cond
from .common import DiffusersBackbone, diffusers_factory, flux_like_sigmas, vae_decode

DEFAULT_MODEL = "Qwen/Qwen-Image"


class QwenImageBackbone(DiffusersBackbone):
    """Qwen-Image on packed latent tokens; ``resolution`` is the square image side in pixels."""

    name = "qwen-image"

    def __init__(
        self,
        pipe: object,
        resolution: int = 512,
        max_sequence_length: int = 512,
        text_pad_to: int | None = None,
        **options: object,
    ):
        super().__init__(pipe, **options)
        self.vae_scale_factor = pipe.vae_scale_factor
        multiple = self.vae_scale_factor * 2
        if resolution < multiple or resolution % multiple:
            raise BackboneConfigError(f"resolution: must be a multiple of {multiple}, got {resolution}")
        if text_pad_to is not None and text_pad_to > max_sequence_length:
            raise BackboneConfigError(f"text_pad_to: must be <= max_sequence_length={max_sequence_length}")
        self.resolution = resolution
        self.max_sequence_length = max_sequence_length
        self.text_pad_to = text_pad_to
        self.grid = (resolution // multiple, resolution // multiple)  # tokens per side after 2×2 packing
        self.latent_shape = (self.grid[0] * self.grid[1], self.transformer.config.in_channels)

    def velocity(
        self, transformer: torch.nn.Module, z: torch.Tensor, t: torch.Tensor, cond: Cond
    ) -> torch.Tensor:
        """(B, N, 4C) packed tokens at flow time t (B,) → velocity (B, N, 4C)."""
        dtype = transformer.dtype
        img_shapes = [[(1, *self.grid)]] * z.shape[0]  # one (frames, h, w) per sample
        return transformer(
            hidden_states=z.to(dtype),  # (B, N, 4C)
            timestep=t.to(dtype),  # (B,) σ in [0, 1]
            encoder_hidden_states=cond["prompt_embeds"].to(dtype),  # (B, L, D_joint)
            encoder_hidden_states_mask=cond["prompt_embeds_mask"],  # (B, L)
            img_shapes=img_shapes,
            return_dict=False,
        )[0]

    def pipeline_sigmas(self, num_steps: int) -> torch.Tensor:
        """QwenImagePipeline's σ: linspace(1, 1/T, T) shifted by μ of the image's N packed tokens."""
        return flux_like_sigmas(
            self.pipe.scheduler, num_steps, self.latent_shape[0], honour_flow_sigmas=False
        )

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        embeds, mask = self.pipe.encode_prompt(
            prompt=list(prompts), device=self.device_, max_sequence_length=self.max_sequence_length
        )
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        if self.text_pad_to is not None:
            pad = self.text_pad_to - embeds.shape[1]
            embeds = torch.nn.functional.pad(embeds[:, : self.text_pad_to], (0, 0, 0, max(pad, 0)))
            mask = torch.nn.functional.pad(mask[:, : self.text_pad_to], (0, max(pad, 0)))
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask.long()}  # (B, L, D), (B, L)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        side = self.resolution
        x = self.pipe._unpack_latents(
            latents, side, side, self.vae_scale_factor
        )  # (B, C, 1, h, w): one frame
        mean = torch.tensor(vae.config.latents_mean, device=x.device, dtype=x.dtype).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=x.device, dtype=x.dtype).view(1, -1, 1, 1, 1)
        return vae_decode(vae, x * std + mean)[:, :, 0]  # (B, 3, H, W)


build = diffusers_factory(QwenImageBackbone, "QwenImagePipeline", DEFAULT_MODEL)
