"""`gauss-toy`: the exact flow velocity of Gaussian data, so a rollout's marginals are known in closed form.

Data x0 ~ N(m, s²·I) in R^D and the rectified flow z_σ = (1 − σ)·x0 + σ·ε (ε ~ N(0, I)) have the marginal

    z_σ ~ N((1 − σ)·m, c(σ)²·I),    c(σ)² = (1 − σ)²·s² + σ²

and the flow-matching velocity E[ε − x0 | z_σ] is, with d = z − (1 − σ)·m,

    v*(z, σ) = (σ − (1 − σ)·s²)·d / c(σ)² − m

(both conditional means of a Gaussian pair). The model is v*(z, σ) + θ with θ ∈ R^D trained from zero, so it
starts at the exact field and still has a gradient. A sampler whose steps preserve the marginals leaves z_j
at σ_j with mean (1 − σ_j)·m and std c(σ_j) (up to its discretisation error): a distribution test of a rollout,
its initial noise and its SDE noise (tests/test_trainer_invariants.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Cond


class GaussToy(torch.nn.Module):
    name = "gauss-toy"

    def __init__(
        self, dim: int = 256, mean: float = 0.5, std: float = 0.5, dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        self.m, self.s = float(mean), float(std)
        self.theta = torch.nn.Parameter(torch.zeros(dim, dtype=dtype))
        self.latent_shape = (dim,)

    def marginal(self, sigma: float) -> tuple[float, float]:
        """Mean and std of z_σ under the data distribution: ((1 − σ)·m, c(σ))."""
        return (1 - sigma) * self.m, ((1 - sigma) ** 2 * self.s**2 + sigma**2) ** 0.5

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond = None) -> torch.Tensor:
        # z (B, D), t (B,) → v (B, D)
        sigma = t[:, None].to(z.dtype)
        c2 = (1 - sigma) ** 2 * self.s**2 + sigma**2
        d = z - (1 - sigma) * self.m
        return (sigma - (1 - sigma) * self.s**2) * d / c2 - self.m + self.theta

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        return None  # unconditional

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """A (B, 1, D, 3) grey strip of x0 in [0, 1]: keeps reward plumbing (brightness) runnable."""
        grey = (latents.float().clamp(0, 1) * 255).round().to(torch.uint8)  # (B, D)
        return grey[:, None, :, None].expand(-1, 1, -1, 3).contiguous()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [self.theta]
