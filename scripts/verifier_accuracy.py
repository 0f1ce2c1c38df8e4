"""Accuracy of the `shapes` verifier on held-out clean images and on noise; shape features of model samples.

    .venv/bin/python scripts/verifier_accuracy.py [--images 3000] [--model-samples 0]

Clean images are drawn with a seed that pretraining never uses; "accuracy" is the share of images whose three
checks (colour, position, shape) all pass. On noise (uniform bytes and clipped Gaussians) the score should be
~0. With ``--model-samples N`` it also samples N images from the shipped tiny-shapes weights (Euler ODE,
20 steps) and prints the fill / top-share quantiles per asked shape next to those of clean data: how the
thresholds FILL_SQUARE and TOP_TRIANGLE in ``jagg_engine/rewards/shapes.py`` were placed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jagg_engine import shapes_data  # noqa: E402
from jagg_engine.rewards import shapes as verifier  # noqa: E402

HELD_OUT_SEED = 987_654_321


def _report(name: str, images: torch.Tensor, prompts: list[str]) -> float:
    parts = verifier.component_scores(images, prompts)
    everything = (parts["colour"] * parts["position"] * parts["shape"]).mean().item()
    score = ((parts["colour"] + parts["position"] + parts["shape"]) / 3).mean().item()
    checks = ", ".join(f"{k} {parts[k].mean().item():.4f}" for k in ("colour", "position", "shape"))
    print(f"{name}: all three right {everything:.4f}; shapes score {score:.4f}; {checks}")
    return everything


def _quantiles(feats: dict[str, np.ndarray], prompts: list[str]) -> None:
    asked = np.array([p.split()[1] for p in prompts])
    for shape in shapes_data.SHAPES:
        m = asked == shape
        for key in ("fill", "top"):
            v = feats[key][m]
            v = v[~np.isnan(v)]
            if len(v):
                q = np.percentile(v, [5, 25, 50, 75, 95]).round(3)
                print(f"  asked {shape:8s} {key:4s} q5/25/50/75/95 = {q.tolist()}")


def _fill_sweep(feats: dict[str, np.ndarray], prompts: list[str]) -> None:
    """Share of square / circle prompts whose blob the rule calls right, for several FILL_SQUARE values."""
    asked = np.array([p.split()[1] for p in prompts])
    round_blob = feats["top"] >= verifier.TOP_TRIANGLE  # nan compares False: no blob
    for thr in (0.84, 0.86, 0.87, 0.88, 0.90, 0.92):
        sq = (round_blob & (feats["fill"] >= thr))[asked == "square"].mean()
        ci = (round_blob & (feats["fill"] < thr))[asked == "circle"].mean()
        print(f"  FILL_SQUARE {thr:.2f}: squares called square {sq:.2f}, circles called circle {ci:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=3000, help="held-out clean images (and noise images / 4)")
    p.add_argument("--model-samples", type=int, default=0, help="also look at this many tiny-shapes samples")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    images, prompts = shapes_data.batch(args.images, seed=HELD_OUT_SEED)
    clean = _report(f"clean ({args.images} held-out images)", torch.from_numpy(images), prompts)
    _quantiles(verifier.blob_features(torch.from_numpy(images), prompts), prompts)
    n = max(1, args.images // 4)
    g = torch.Generator().manual_seed(HELD_OUT_SEED)
    uniform = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, generator=g)
    _report(f"uniform noise ({n})", uniform, prompts[:n])
    gauss = ((torch.randn(n, 32, 32, 3, generator=g).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    _report(f"gaussian noise ({n})", gauss, prompts[:n])

    if args.model_samples > 0:
        from jagg_engine.backbones.tiny_shapes import build
        from jagg_engine.sde import eval_noise, ode_sample

        model = build()
        asked = shapes_data.sample_prompts(args.model_samples, seed=HELD_OUT_SEED)
        noise = torch.stack([eval_noise(model.latent_shape, i, 0) for i in range(len(asked))])
        with torch.no_grad():
            out = model.decode(ode_sample(model, model.encode_prompts(asked), noise, num_steps=20))
        _report(f"tiny-shapes samples ({len(asked)})", out, asked)
        feats = verifier.blob_features(out, asked)
        _quantiles(feats, asked)
        _fill_sweep(feats, asked)
    print(f"verifier accuracy on clean held-out images: {clean:.2%}")
    return 0 if clean >= 0.95 else 1


if __name__ == "__main__":
    raise SystemExit(main())
