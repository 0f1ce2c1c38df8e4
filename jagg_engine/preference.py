"""A preference model learned online from a person's picks: Bradley–Terry on frozen image features.

Pure torch. Used by the ``picks`` reward (:mod:`jagg_engine.rewards.picks`); HERO (Hiranaka et al., ICLR
2025) learns a reward from online human feedback in the same spirit, here with the simplest model that can
be fitted from a few hundred clicks.

Notation
--------
    φ(x)   (D,) frozen features of image x (:func:`image_features`), standardised by the mean and std of every
           image the model has seen (:attr:`PreferenceModel.mean`, :attr:`PreferenceModel.std`)
    w      (D,) the model's weights; s(x) = w · φ(x) is the learned score (the reward)
    P(a ≻ b) = σ(s(a) − s(b))                                   Bradley & Terry (1952)
    a vote on a group of G images: "best k" = k ≻ j for every j ≠ k; "worst k" = j ≻ k for every j ≠ k;
           "skip" gives no pair
    fit:   w = argmin Σ_pairs softplus(−(φ_win − φ_lose) · w) + λ/2 ‖w‖²     (Newton's method, exact)
    Σ      = H⁻¹ at w, H = Σ_pairs σ'(z) d dᵀ + λ I: the Laplace approximation of the posterior of w
    uncertainty of a group = mean_i sqrt((φ_i − φ̄)ᵀ Σ (φ_i − φ̄)): the posterior std of each sample's score
           relative to its group's mean (what GRPO's group advantage reads); the groups asked are those where
           it is largest
    agreement of a vote = the share of its pairs the model orders right (a tie counts ½), with the model
           fitted on the votes cast *before* it: every vote is held back from the model that predicts it
           (progressive validation), so the logged agreement is an out-of-sample figure

Features (:func:`image_features`): a fixed random projection, not a trained network (the tiny-shapes verifier
is programmatic and has no penultimate layer to borrow): the image resized to 32 × 32, its 4 × 4 average
colours (48 values), and a 5 × 5 stride-2 convolution with 32 random filters drawn once from seed 0, ReLU,
mean- and max-pooled (64 values). D = 112, the same for every backbone and image size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

FEATURE_SIZE = 32  # images are resized to this side first
FEATURE_DIM = 3 * 4 * 4 + 2 * 32
CHOICES = ("best", "worst", "skip")


def _filters() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 3, 5, 5, generator=gen, dtype=torch.float32)  # (C_out, C_in, k, k)
    return w / (3 * 25) ** 0.5


_FILTERS = _filters()


@torch.no_grad()
def image_features(images: torch.Tensor) -> torch.Tensor:
    """Frozen features of uint8 images (B, H, W, 3) → (B, 112) float32 (see the module's docstring)."""
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"image_features: images must be (B, H, W, 3), got {tuple(images.shape)}")
    x = images.float().permute(0, 3, 1, 2) / 255.0  # (B, 3, H, W)
    x = F.interpolate(x, size=(FEATURE_SIZE, FEATURE_SIZE), mode="area")  # (B, 3, 32, 32)
    colours = F.adaptive_avg_pool2d(x, 4).flatten(1)  # (B, 48)
    h = F.relu(F.conv2d(x - 0.5, _FILTERS, stride=2))  # (B, 32, 14, 14)
    return torch.cat([colours, h.mean(dim=(2, 3)), h.amax(dim=(2, 3))], dim=1)  # (B, 112)


def vote_pairs(group: torch.Tensor, sample: int | None, choice: str) -> torch.Tensor:
    """Winner − loser feature differences of one vote on a group (G, D) → (P, D): G − 1 rows, or 0 for a skip."""
    if choice not in CHOICES:
        raise ValueError(f"vote choice: must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "skip":
        return group.new_zeros(0, group.shape[1])
    others = torch.cat([group[:sample], group[sample + 1 :]])  # (G-1, D)
    diff = group[sample][None] - others
    return diff if choice == "best" else -diff


def fit_bradley_terry(
    diffs: torch.Tensor, l2: float = 1.0, iters: int = 50
) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton's method on Σ softplus(−d · w) + λ/2 ‖w‖² for pair differences ``diffs`` (P, D).

    Returns (w (D,), H (D, D) the Hessian at w, whose inverse is the Laplace posterior covariance). float64.
    """
    d = diffs.double()
    dim = d.shape[1]
    w = torch.zeros(dim, dtype=torch.float64)
    eye = torch.eye(dim, dtype=torch.float64)
    hess = l2 * eye
    for _ in range(iters):
        z = d @ w  # (P,)
        p = torch.sigmoid(-z)  # the loss's slope at each pair
        grad = -(d * p[:, None]).sum(0) + l2 * w
        hess = (d * (p * (1 - p))[:, None]).T @ d + l2 * eye  # (D, D)
        step = torch.linalg.solve(hess, grad)
        w = w - step
        if float(step.abs().max()) < 1e-8:
            break
    z = d @ w
    p = torch.sigmoid(-z)
    hess = (d * (p * (1 - p))[:, None]).T @ d + l2 * eye
    return w, hess


class PreferenceModel:
    """Bradley–Terry on frozen features, refitted from every vote kept (see the module's docstring).

    Groups are added with their features under a key (step, group index); votes refer to them by key.
    """

    def __init__(self, l2: float = 1.0, dim: int = FEATURE_DIM):
        self.l2, self.dim = l2, dim
        self.groups: dict[tuple[int, int], torch.Tensor] = {}  # key → (G, D) raw features
        self.votes: list[tuple[tuple[int, int], int | None, str]] = []
        self.agreements: list[float] = []  # each vote's agreement when it arrived (held back), in order
        self.w = torch.zeros(dim, dtype=torch.float64)
        self.cov = torch.eye(dim, dtype=torch.float64) / l2
        self.mean = torch.zeros(dim, dtype=torch.float64)
        self.std = torch.ones(dim, dtype=torch.float64)

    def add_group(self, key: tuple[int, int], features: torch.Tensor) -> None:
        self.groups[key] = features.detach().double().cpu()

    def standardise(self, features: torch.Tensor) -> torch.Tensor:
        return (features.double() - self.mean) / self.std

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """s = w · φ for raw features (B, D) → (B,) float32."""
        return (self.standardise(features) @ self.w).float()

    def uncertainty(self, groups: torch.Tensor) -> torch.Tensor:
        """Posterior std of each sample's score relative to its group's mean, averaged: (N, G, D) → (N,)."""
        phi = self.standardise(groups)
        centred = phi - phi.mean(dim=1, keepdim=True)  # (N, G, D)
        var = torch.einsum("ngd,de,nge->ng", centred, self.cov, centred).clamp_min(0)
        return var.sqrt().mean(dim=1).float()

    def agreement(self, key: tuple[int, int], sample: int | None, choice: str) -> float | None:
        """The share of the vote's pairs the current model orders right (ties ½); None for a skip."""
        pairs = vote_pairs(self.standardise(self.groups[key]), sample, choice)
        if pairs.shape[0] == 0:
            return None
        z = pairs @ self.w
        return float(((z > 0).double() + 0.5 * (z == 0).double()).mean())

    def add_votes(self, votes: Sequence[tuple[tuple[int, int], int | None, str]]) -> list[float]:
        """Take new votes (key, sample, choice): each is scored by the model before any of them is used (held
        back), then the model is refitted on every vote. Returns the agreements of the non-skip ones."""
        got = []
        for key, sample, choice in votes:
            a = self.agreement(key, sample, choice)
            if a is not None:
                got.append(a)
        self.agreements.extend(got)
        self.votes.extend(votes)
        self.fit()
        return got

    def fit(self) -> None:
        """Refit w and its posterior on every vote kept, with the standardisation of every group seen."""
        if self.groups:
            every = torch.cat(list(self.groups.values()))  # (N·G, D)
            self.mean, self.std = every.mean(0), every.std(0, unbiased=False).clamp_min(1e-6)
        rows = [vote_pairs(self.standardise(self.groups[k]), s, c) for k, s, c in self.votes]
        diffs = torch.cat(rows) if rows else torch.zeros(0, self.dim, dtype=torch.float64)
        self.w, hess = fit_bradley_terry(diffs, self.l2)
        self.cov = torch.linalg.inv(hess)
