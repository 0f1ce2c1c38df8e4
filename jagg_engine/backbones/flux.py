"""`flux`: FLUX.1 (diffusers FluxPipeline) as a Backbone, with LoRA on the transformer.

Latents are the pipeline's *packed* tokens: a (C, H/8, W/8) VAE latent cut into 2×2 patches gives
z : (B, N, 4C) with N = (H/16)·(W/16). The velocity call, packing ids and guidance embedding are
:class:`~jagg_engine.backbones.flux_core.FluxVelocity`; this module adds loading, prompt encoding (CLIP pooled
+ T5 sequence, the pipeline's own ``encode_prompt``) and VAE decoding (unpack, unscale, unshift).

cond = {"prompt_embeds": (B, L, D_joint), "pooled": (B, D_pool)}.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import BackboneConfigError
from .base import Cond
from .common import DiffusersBackbone, diffusers_factory, flux_like_sigmas, vae_decode
from .flux_core import FluxVelocity

DEFAULT_MODEL = "black-forest-labs/FLUX.1-dev"


class FluxBackbone(DiffusersBackbone):
    """FLUX.1 on packed latent tokens; ``resolution`` is the square image side in pixels."""

    name = "flux"

    def __init__(
        self,
        pipe: object,
        resolution: int = 512,
        guidance: float = 3.5,
        max_sequence_length: int = 512,
        **options: object,
    ):
        super().__init__(pipe, **options)
        self.vae_scale_factor = pipe.vae_scale_factor
        side = resolution // (self.vae_scale_factor * 2)  # tokens per side after 2×2 packing
        if side < 1 or resolution % (self.vae_scale_factor * 2):
            raise BackboneConfigError(
                f"resolution: must be a multiple of {self.vae_scale_factor * 2}, got {resolution}"
            )
        self.resolution = resolution
        self.max_sequence_length = max_sequence_length
        self.velocity_fn = FluxVelocity(self.transformer, (side, side), max_sequence_length, guidance).to(
            self.device_
        )
        self.latent_shape = self.velocity_fn.latent_shape  # (N, 4C)

    def velocity(
        self, transformer: torch.nn.Module, z: torch.Tensor, t: torch.Tensor, cond: Cond
    ) -> torch.Tensor:
        """(B, N, 4C) packed tokens at flow time t (B,) → velocity (B, N, 4C)."""
        self.velocity_fn.transformer = transformer  # the policy, or the frozen reference copy
        try:
            return self.velocity_fn(z, t, cond)
        finally:
            self.velocity_fn.transformer = self.transformer

    def pipeline_sigmas(self, num_steps: int) -> torch.Tensor:
        """FluxPipeline's σ: linspace(1, 1/T, T) shifted by μ of the image's N packed tokens (dynamic shift)."""
        return flux_like_sigmas(self.pipe.scheduler, num_steps, self.latent_shape[0])

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=list(prompts),
            prompt_2=None,
            device=self.device_,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled": pooled}  # (B, L, D_joint), (B, D_pool)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        x = self.pipe._unpack_latents(
            latents, self.resolution, self.resolution, self.vae_scale_factor
        )  # (B,C,h,w)
        x = x / vae.config.scaling_factor + vae.config.shift_factor
        return vae_decode(vae, x)


build = diffusers_factory(FluxBackbone, "FluxPipeline", DEFAULT_MODEL)
