"""`linear-toy`: the velocity field under which Theorem 1 holds, for tests and the probe.

    v_θ(z, t) = A·z + θ_0 + t·θ_1        z, θ_0, θ_1 ∈ R^D, A ∈ R^{D×D}

With A fixed and θ = (θ_0, θ_1) trained, ∂v/∂θ = [I, t·I] is affine in t and independent of z, so the
t-weighted interpolation of the endpoint Jacobians is exact on ANY trajectory (SDE noise included).
With ``train_a=True`` A is trained too; then ∂v/∂A depends linearly on z and exactness also needs the group's
z_j on the straight line z_j = (1 − α_j)·z_0 + α_j·z_{W−1} (PAPER.md, Theorem 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Cond


class LinearToy(torch.nn.Module):
    name = "linear-toy"

    def __init__(
        self, dim: int = 16, seed: int = 0, train_a: bool = False, dtype: torch.dtype = torch.float64
    ):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        a = -0.5 * torch.eye(dim, dtype=dtype) + 0.1 * torch.randn(dim, dim, generator=g, dtype=dtype)
        if train_a:
            self.A = torch.nn.Parameter(a)
        else:
            self.register_buffer("A", a)
        self.theta0 = torch.nn.Parameter(0.5 * torch.randn(dim, generator=g, dtype=dtype))
        self.theta1 = torch.nn.Parameter(0.5 * torch.randn(dim, generator=g, dtype=dtype))
        self.latent_shape = (dim,)

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond = None) -> torch.Tensor:
        # z (B, D), t (B,) → v (B, D)
        return z @ self.A.T + self.theta0 + t[:, None].to(z.dtype) * self.theta1

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        return None  # unconditional

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """A (B, 1, D, 3) grey strip: the toy has no image space; this keeps reward plumbing runnable."""
        grey = ((latents.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)  # (B, D)
        return grey[:, None, :, None].expand(-1, 1, -1, 3).contiguous()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]
