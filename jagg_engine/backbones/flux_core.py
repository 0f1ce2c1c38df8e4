"""Velocity callable around diffusers' FluxTransformer2DModel on *packed* latents, and the `tiny-flux` and
`bench-flux` backbones (small configs, seeded random weights).

Flux works on packed latent tokens: a (C, H, W) latent is cut into 2×2 patches and flattened to
(H/2 · W/2, 4C) tokens (diffusers ``FluxPipeline._pack_latents``). The engine's latent is that token tensor,
so ``z`` has shape (B, N, C_in) and the positional ids (img_ids (N, 3), txt_ids (L, 3)), which carry no batch
dimension, live on the wrapper.

``cond`` is ``{"prompt_embeds": (B, L, D_joint), "pooled": (B, D_pool)}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import FluxTransformer2DModel

from .base import Cond, hashed_prompt_embeddings


def latent_image_ids(height: int, width: int) -> torch.Tensor:
    """Ids (row, col) of an (height × width) token grid, as diffusers' Flux pipeline builds them. (N, 3)."""
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = torch.arange(height)[:, None]
    ids[..., 2] = torch.arange(width)[None, :]
    return ids.reshape(height * width, 3)


class FluxVelocity(torch.nn.Module):
    """v(z, t, cond) for a FluxTransformer2DModel on packed tokens.

    Args:
        transformer: the diffusers model.
        grid: (h, w) of the token grid, N = h·w.
        text_len: number of text tokens L (txt_ids are zeros, as in the Flux pipeline).
        guidance: distilled-guidance scale fed to the guidance embedding when the model has one.
    """

    def __init__(
        self, transformer: FluxTransformer2DModel, grid: tuple[int, int], text_len: int, guidance: float = 3.5
    ):
        super().__init__()
        self.transformer = transformer
        self.grid = grid
        self.guidance = guidance
        self.register_buffer("img_ids", latent_image_ids(*grid), persistent=False)
        self.register_buffer("txt_ids", torch.zeros(text_len, 3), persistent=False)

    @property
    def latent_shape(self) -> tuple[int, int]:
        return (self.grid[0] * self.grid[1], self.transformer.config.in_channels)

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        tf = self.transformer
        dtype = tf.dtype
        guidance = None
        if tf.config.guidance_embeds:
            guidance = torch.full((z.shape[0],), self.guidance, device=z.device, dtype=dtype)
        out = tf(
            hidden_states=z.to(dtype),  # (B, N, C_in)
            encoder_hidden_states=cond["prompt_embeds"].to(dtype),  # (B, L, D_joint)
            pooled_projections=cond["pooled"].to(dtype),  # (B, D_pool)
            timestep=t.to(dtype),  # (B,) in [0, 1]; Flux scales by 1000 inside
            img_ids=self.img_ids.to(dtype),
            txt_ids=self.txt_ids.to(dtype),
            guidance=guidance,
            return_dict=False,
        )[0]
        return out  # (B, N, C_out)


def flux_config(
    layers: int,
    single_layers: int,
    heads: int,
    head_dim: int,
    text_dim: int,
    pooled_dim: int,
    rope: tuple[int, int, int],
    in_channels: int = 16,
    guidance: bool = False,
) -> dict[str, Any]:
    """The FluxTransformer2DModel keyword config of one size, on packed tokens (patch size 1): ``layers``
    double-stream and ``single_layers`` single-stream blocks, ``heads`` × ``head_dim`` attention, text
    embeddings of ``text_dim`` (pooled: ``pooled_dim``), rotary axes ``rope`` (summing to ``head_dim``)."""
    return dict(
        patch_size=1,
        in_channels=in_channels,
        num_layers=layers,
        num_single_layers=single_layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=text_dim,
        pooled_projection_dim=pooled_dim,
        guidance_embeds=guidance,
        axes_dims_rope=rope,
    )


TINY_FLUX_CONFIG = flux_config(1, 1, heads=2, head_dim=16, text_dim=32, pooled_dim=32, rope=(4, 6, 6))
"""`tiny-flux`: one block of each kind, width 32."""
# black-forest-labs/FLUX.1-dev (transformer/config.json): 11.9 B parameters.
FLUX_DEV_CONFIG = flux_config(
    19,
    38,
    heads=24,
    head_dim=128,
    text_dim=4096,
    pooled_dim=768,
    rope=(16, 56, 56),
    in_channels=64,
    guidance=True,
)


class TinyFlux(torch.nn.Module):
    """`tiny-flux`: a FluxTransformer2DModel from a small config with seeded random weights (no download).

    For tests and the gradient probe: prompts map to seeded random embeddings (a hash of the text), latents
    are an 8×8 grid of 16-channel tokens; ``config``, ``grid`` and ``text_len`` make other sizes (`bench-flux`).
    ``decode`` maps the first 3 channels to a grey-ish uint8 image (there is no VAE); it exists so the reward
    plumbing can run end to end.
    """

    name = "tiny-flux"

    def __init__(
        self,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        grid: tuple[int, int] = (8, 8),
        config: dict[str, Any] | None = None,
        text_len: int = 4,
        device: str | torch.device = "cpu",
    ):
        super().__init__()
        torch.manual_seed(seed)
        with torch.device(device):
            transformer = FluxTransformer2DModel(**(config or TINY_FLUX_CONFIG))
        if dtype != torch.float32:
            transformer = transformer.to(dtype)
        self.text_len = text_len
        self.velocity = FluxVelocity(transformer, grid=grid, text_len=text_len).to(device)
        self.latent_shape = self.velocity.latent_shape
        self.dtype = dtype

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        return self.velocity(z, t, cond)

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        """Seeded random embeddings per prompt (:func:`~jagg_engine.backbones.base.hashed_prompt_embeddings`),
        on the model's device and dtype: (B, L, D_joint), (B, D_pool)."""
        cfg = self.velocity.transformer.config
        embeds, pooled = hashed_prompt_embeddings(
            prompts, self.text_len, cfg.joint_attention_dim, cfg.pooled_projection_dim
        )
        device = self.velocity.img_ids.device
        return {"prompt_embeds": embeds.to(device, self.dtype), "pooled": pooled.to(device, self.dtype)}

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        h, w = self.velocity.grid
        rgb = latents[..., :3].reshape(latents.shape[0], h, w, 3).float()  # (B, h, w, 3)
        return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.velocity.transformer.parameters() if p.requires_grad]


BENCH_FLUX_CONFIG = flux_config(2, 4, heads=4, head_dim=32, text_dim=64, pooled_dim=64, rope=(8, 12, 12))
"""2.3 M parameters; at batch 4 × 256 tokens one forward takes ~70–100 ms on one core of the project CPU."""


class BenchFlux(TinyFlux):
    """`bench-flux`: a FluxTransformer2DModel from ``config`` (default :data:`BENCH_FLUX_CONFIG`), seeded random
    weights, a 16×16 token grid and 8 text tokens — large enough that the model, not Python, dominates a step.

    Everything but the size is `tiny-flux` (:class:`~jagg_engine.backbones.flux_core.TinyFlux`).
    """

    name = "bench-flux"

    def __init__(
        self,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        config: dict[str, Any] | None = None,
        grid: tuple[int, int] = (16, 16),
        text_len: int = 8,
    ):
        super().__init__(seed, dtype, grid, config or BENCH_FLUX_CONFIG, text_len, device)
