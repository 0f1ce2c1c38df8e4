"""`mode-toy`: a prompt-conditioned MLP flow over 8-D points, four modes per prompt: GRPO in seconds on a CPU.

The data of prompt k (one of :data:`PROMPTS`, 16 of them) is an equal mixture of 4 Gaussians in R^8, centres
:func:`centres` (radius 2, a fixed draw) and std :data:`MODE_STD`. The model is an MLP (3 hidden layers of 128,
SiLU; inputs z, a sinusoidal embedding of t and the prompt's one-hot) pretrained by rectified flow on that data
(``python -m jagg_engine.backbones.mode_toy``, about a minute; weights shipped in ``assets/mode-toy/``). Its
velocity's Jacobian in the weights depends on z (unlike ``linear-toy`` and ``gauss-toy``, where Theorem 1 makes
JAGG exact), so JAGG's interpolation error is there as in a transformer, at 37 k parameters.

The reward ``mode-toy`` (:mod:`jagg_engine.rewards.mode_toy`) wants mode 0 of the prompt and, inside it,
precision: r = exp(−‖x − μ_{k,0}‖² / (2·τ²)). The pretrained model puts a quarter of its samples in mode 0 at
std 0.3 (r ≈ 0.24 there, ≈ 0 elsewhere), so a run first moves mass between modes, then sharpens a mode: the
late phase is about the velocity's contraction of noise, where the tiny-shapes plateau was seen.

Images: the toy has no pixels; :meth:`ModeToy.decode` writes each coordinate in 16-bit fixed point over
[−8, 8) (high byte in R, low byte in G) into a (B, 1, 8, 3) strip that :func:`decode_points` reads back
exactly (to 2.4e−4), so the reward plumbing stays the images-and-prompts one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from .base import Cond

DIM = 8
NUM_PROMPTS = 16
NUM_MODES = 4
MODE_RADIUS = 2.0
MODE_STD = 0.3
CENTRES_SEED = 20261205
PROMPTS = tuple(f"mode-toy {k}" for k in range(NUM_PROMPTS))
DEFAULT_WEIGHTS = Path(__file__).resolve().parents[2] / "assets" / "mode-toy" / "model.pt"
_FIXED_RANGE = 8.0


def centres() -> torch.Tensor:
    """The mode centres (NUM_PROMPTS, NUM_MODES, DIM), float32: a fixed draw of radius MODE_RADIUS."""
    g = torch.Generator().manual_seed(CENTRES_SEED)
    c = torch.randn(NUM_PROMPTS, NUM_MODES, DIM, generator=g)
    return MODE_RADIUS * c / c.norm(dim=-1, keepdim=True)


def prompt_index(prompts: Sequence[str]) -> torch.Tensor:
    """(B,) long indices of ``prompts`` in :data:`PROMPTS`; ValueError naming the first unknown prompt."""
    out = []
    for p in prompts:
        if p not in PROMPTS:
            raise ValueError(
                f"mode-toy: unknown prompt {p!r}; allowed: 'mode-toy 0' … 'mode-toy {NUM_PROMPTS - 1}'"
            )
        out.append(PROMPTS.index(p))
    return torch.tensor(out, dtype=torch.long)


def all_prompts() -> list[str]:
    return list(PROMPTS)


def sample_data(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of the data and their prompt indices: (n, DIM) float32, (n,) long."""
    k = torch.randint(NUM_PROMPTS, (n,), generator=generator)
    m = torch.randint(NUM_MODES, (n,), generator=generator)
    x = centres()[k, m] + MODE_STD * torch.randn(n, DIM, generator=generator)
    return x, k


def encode_points(points: torch.Tensor) -> torch.Tensor:
    """(B, DIM) float → (B, 1, DIM, 3) uint8: 16-bit fixed point over [−8, 8), high byte R, low byte G."""
    u = (points.float().clamp(-_FIXED_RANGE, _FIXED_RANGE - 1e-3) + _FIXED_RANGE) / (2 * _FIXED_RANGE) * 65536
    u = u.floor().long().clamp(0, 65535)
    img = torch.stack([u // 256, u % 256, torch.zeros_like(u)], dim=-1)
    return img[:, None].to(torch.uint8).contiguous()


def decode_points(images: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode_points` (the bin's centre): (B, 1, DIM, 3) uint8 → (B, DIM) float32."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1:] != (1, DIM, 3):
        raise ValueError(
            f"mode-toy: expected (B, 1, {DIM}, 3) uint8 strips, got {tuple(images.shape)} {images.dtype}"
        )
    u = images[:, 0, :, 0].long() * 256 + images[:, 0, :, 1].long()
    return (u.float() + 0.5) / 65536 * (2 * _FIXED_RANGE) - _FIXED_RANGE


class ModeToy(torch.nn.Module):
    name = "mode-toy"

    def __init__(self, hidden: int = 128, freqs: int = 16):
        super().__init__()
        self.freqs = freqs
        self.latent_shape = (DIM,)
        width_in = DIM + 2 * freqs + NUM_PROMPTS
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width_in, hidden),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, DIM),
        )

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        f = torch.exp(torch.linspace(0.0, math.log(100.0), self.freqs, dtype=t.dtype, device=t.device))
        angle = t[:, None] * f[None] * math.pi
        return torch.cat([angle.sin(), angle.cos()], dim=-1)

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        # z (B, DIM), t (B,), cond {"onehot": (B, NUM_PROMPTS)} → v (B, DIM)
        t = t.to(z.dtype)
        x = torch.cat([z, self.time_embedding(t), cond["onehot"].to(z.dtype)], dim=-1)
        return self.net(x)

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        idx = prompt_index(prompts)
        return {"onehot": torch.nn.functional.one_hot(idx, NUM_PROMPTS).float()}

    def sample_prompts(self, n: int, seed: int = 0) -> list[str]:
        g = torch.Generator().manual_seed(seed)
        return [PROMPTS[i] for i in torch.randint(NUM_PROMPTS, (n,), generator=g).tolist()]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return encode_points(latents)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def pretrain(steps: int = 6000, batch: int = 1024, lr: float = 2e-3, seed: int = 0) -> ModeToy:
    """Rectified-flow pretraining on :func:`sample_data` (t uniform, target ε − x0), AdamW with cosine decay."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = ModeToy()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        x0, k = sample_data(batch, g)
        t = torch.rand(batch, generator=g)
        eps = torch.randn(batch, DIM, generator=g)
        z = (1 - t[:, None]) * x0 + t[:, None] * eps
        cond = {"onehot": torch.nn.functional.one_hot(k, NUM_PROMPTS).float()}
        loss = (model(z, t, cond) - (eps - x0)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def build(weights: str | Path | None = None, dtype: torch.dtype | str = torch.float32) -> ModeToy:
    """The pretrained `mode-toy` from ``weights`` (default: the shipped ``assets/mode-toy/model.pt``)."""
    from . import BackboneConfigError

    path = Path(weights) if weights is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        raise BackboneConfigError(
            f"mode-toy: missing weights {path}; run python -m jagg_engine.backbones.mode_toy"
        )
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise BackboneConfigError(f"mode-toy: unknown dtype {dtype!r}; e.g. float32, float64")
        dtype = getattr(torch, dtype)
    model = ModeToy()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval().to(dtype=dtype)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description="Pretrain the mode-toy flow and save its weights.")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = pretrain(args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
