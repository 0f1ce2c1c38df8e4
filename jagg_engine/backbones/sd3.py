"""`sd3`: Stable Diffusion 3 / 3.5 (diffusers StableDiffusion3Pipeline) as a Backbone, with LoRA.

Latents are the VAE's unpacked (C, H/8, W/8) maps, scaled as the pipeline scales them. SD3's transformer takes
the timestep on the scheduler's scale, σ·1000. With ``cfg_scale > 1`` the velocity runs the conditional and
the unconditional (negative-prompt) branches in one batch of 2B and combines them,
v = v_u + s·(v_c − v_u) (classifier-free guidance, Ho & Salimans 2022; Flow-GRPO trains SD3.5 this way).

cond = {"prompt_embeds": (B, L, D_joint), "pooled": (B, D_pool)} and, with guidance,
also {"negative_prompt_embeds": (B, L, D_joint), "negative_pooled": (B, D_pool)}.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import BackboneConfigError
from .base import Cond
from .common import DiffusersBackbone, diffusers_factory, scheduler_sigmas, vae_decode

DEFAULT_MODEL = "stabilityai/stable-diffusion-3.5-medium"


class SD3Backbone(DiffusersBackbone):
    """SD3 on (C, h, w) latents; ``resolution`` is the square image side in pixels."""

    name = "sd3"

    def __init__(
        self,
        pipe: object,
        resolution: int = 512,
        cfg_scale: float = 1.0,
        negative_prompt: str = "",
        max_sequence_length: int = 256,
        **options: object,
    ):
        super().__init__(pipe, **options)
        self.vae_scale_factor = pipe.vae_scale_factor
        multiple = self.vae_scale_factor * self.transformer.config.patch_size
        if resolution < multiple or resolution % multiple:
            raise BackboneConfigError(f"resolution: must be a multiple of {multiple}, got {resolution}")
        if cfg_scale < 1:
            raise BackboneConfigError(f"cfg_scale: must be >= 1 (1 = no guidance), got {cfg_scale}")
        self.resolution = resolution
        self.cfg_scale = cfg_scale
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        side = resolution // self.vae_scale_factor
        self.latent_shape = (self.transformer.config.in_channels, side, side)

    def velocity(
        self, transformer: torch.nn.Module, z: torch.Tensor, t: torch.Tensor, cond: Cond
    ) -> torch.Tensor:
        """(B, C, h, w) latents at flow time t (B,) → velocity (B, C, h, w), guided when cfg_scale > 1."""
        return sd3_velocity(transformer, z, t, cond, self.cfg_scale)

    def pipeline_sigmas(self, num_steps: int) -> torch.Tensor:
        """StableDiffusion3Pipeline's σ: the scheduler's own grid and static shift (3.0 for SD3/3.5); a dynamic
        shift from the (h/p)·(w/p) patch count only when its scheduler is configured for one."""
        patch = self.transformer.config.patch_size
        side = self.latent_shape[1] // patch
        dynamic = self.pipe.scheduler.config.get("use_dynamic_shifting", False)
        return scheduler_sigmas(
            self.pipe.scheduler, num_steps, image_seq_len=side * side if dynamic else None, max_shift=1.16
        )

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        guided = self.cfg_scale > 1
        prompts = list(prompts)
        embeds, neg_embeds, pooled, neg_pooled = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device_,
            do_classifier_free_guidance=guided,
            negative_prompt=[self.negative_prompt] * len(prompts) if guided else None,
            max_sequence_length=self.max_sequence_length,
        )
        cond = {"prompt_embeds": embeds, "pooled": pooled}  # (B, L, D_joint), (B, D_pool)
        if guided:
            cond.update(negative_prompt_embeds=neg_embeds, negative_pooled=neg_pooled)
        return cond

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        return vae_decode(vae, latents / vae.config.scaling_factor + vae.config.shift_factor)


def sd3_velocity(
    transformer: torch.nn.Module, z: torch.Tensor, t: torch.Tensor, cond: Cond, cfg_scale: float = 1.0
) -> torch.Tensor:
    """v̂ of an SD3Transformer2DModel: (B, C, h, w) latents at flow time t (B,) → (B, C, h, w).

    With ``cfg_scale > 1`` the unconditional and conditional branches run as one batch of 2B and are combined
    as v = v_u + s·(v_c − v_u); ``cond`` then also holds the negative prompt's embeddings.
    """
    dtype = transformer.dtype
    embeds, pooled = cond["prompt_embeds"], cond["pooled"]
    guided = cfg_scale > 1
    if guided:  # one batch [uncond; cond] of 2B
        z = torch.cat([z, z])
        t = torch.cat([t, t])
        embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
        pooled = torch.cat([cond["negative_pooled"], pooled])
    v = transformer(
        hidden_states=z.to(dtype),  # (B', C, h, w)
        timestep=(t * 1000).to(dtype),  # (B',) on the scheduler's 0..1000 scale
        encoder_hidden_states=embeds.to(dtype),  # (B', L, D_joint)
        pooled_projections=pooled.to(dtype),  # (B', D_pool)
        return_dict=False,
    )[0]
    if guided:
        v_uncond, v_cond = v.chunk(2)
        v = v_uncond + cfg_scale * (v_cond - v_uncond)
    return v


build = diffusers_factory(SD3Backbone, "StableDiffusion3Pipeline", DEFAULT_MODEL)
