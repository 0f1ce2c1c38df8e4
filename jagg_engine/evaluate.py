"""`jagg eval`: deterministic ODE samples of fixed prompts × seeds, scored by a reward, with a grid and a JSON.

    jagg eval --backbone tiny-shapes --reward shapes [--prompts FILE] [--seeds 4] [--steps 20] [--out DIR]

Each (prompt i, seed s) pair gets its own noise (:func:`jagg_engine.sde.eval_noise`: a generator seeded
s·100003 + i), so a sample does not depend on the batch size or on the other prompts. Sampling is the Euler ODE
of the flow: σ_k from 1 to 0 (optionally time-shifted), z ← z + (σ_{k+1} − σ_k)·v̂(z, σ_k) (rectified flow,
Liu et al. 2022), the engine's :func:`jagg_engine.sde.ode_sample`, the same as the trainer's eval. Printed:
mean ± std of the reward over all samples (and, for the shapes rewards, of each verifier check); written:
``grid.png`` (samples prompt-major, seeds side by side, upscaled) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from . import shapes_data
from .backbones.base import Backbone
from .devices import resolve_device
from .sde import eval_noise, ode_sample

DEFAULT_NUM_PROMPTS = 64


def eval_prompts(n: int = DEFAULT_NUM_PROMPTS) -> list[str]:
    """``n`` fixed prompts out of the 90 shapes captions (a seeded permutation, the same on every machine)."""
    prompts = shapes_data.all_prompts()
    order = np.random.default_rng(0).permutation(len(prompts))[:n]
    return [prompts[i] for i in sorted(order)]


def image_grid(images: np.ndarray, columns: int, scale: int, gap: int = 2) -> np.ndarray:
    """uint8 images (N, H, W, 3) → one uint8 grid image, nearest-neighbour upscaled by ``scale``."""
    n, h, w, _ = images.shape
    big = images.repeat(scale, axis=1).repeat(scale, axis=2)  # (N, sH, sW, 3)
    rows = -(-n // columns)
    cell_h, cell_w = h * scale + gap, w * scale + gap
    grid = np.full((rows * cell_h + gap, columns * cell_w + gap, 3), 255, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, columns)
        grid[
            gap + r * cell_h : gap + r * cell_h + h * scale, gap + c * cell_w : gap + c * cell_w + w * scale
        ] = big[i]
    return grid


class EvalResult(NamedTuple):
    """Samples and scores, prompt-major: sample k is prompt k // seeds with seed k % seeds."""

    images: np.ndarray  # (P·S, H, W, 3) uint8
    scores: torch.Tensor  # (P·S,) float32
    components: dict[str, torch.Tensor] | None  # colour / position / shape, each (P·S,), for shapes rewards
    seconds: float


def sample_and_score(
    model: Backbone,
    reward: Callable[[torch.Tensor, list[str]], torch.Tensor],
    prompts: Sequence[str],
    seeds: int,
    steps: int,
    shift: float = 1.0,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    components: bool = False,
    progress: bool = True,
    schedule: tuple[float, ...] | None = None,
) -> EvalResult:
    """Deterministic ODE samples of every (prompt, seed) pair, scored by ``reward``; ``schedule``: an explicit
    σ grid (the pipeline's, as the trainer's ``schedule: pipeline``) instead of uniform σ shifted by ``shift``."""
    pairs = [(i, s) for i in range(len(prompts)) for s in range(seeds)]  # prompt-major
    images, scores, parts = [], [], []
    start = time.time()
    for b0 in tqdm(range(0, len(pairs), batch_size), desc="eval", unit="batch", disable=not progress):
        chunk = pairs[b0 : b0 + batch_size]
        batch_prompts = [prompts[i] for i, _ in chunk]
        noise = torch.stack([eval_noise(model.latent_shape, i, s) for i, s in chunk]).to(device)
        with torch.no_grad():
            cond = model.encode_prompts(batch_prompts)
            z = ode_sample(model, cond, noise, steps, shift, schedule)
            imgs = model.decode(z).cpu()  # (b, H, W, 3) uint8
        scores.append(reward(imgs, batch_prompts).float().cpu())
        if components:
            from .rewards.shapes import component_scores

            checks = component_scores(imgs, batch_prompts)
            parts.append({k: checks[k] for k in ("colour", "position", "shape")})
        images.append(imgs.numpy())
    per = {k: torch.cat([c[k] for c in parts]) for k in parts[0]} if parts else None
    return EvalResult(np.concatenate(images), torch.cat(scores), per, time.time() - start)


def _parse_options(items: Sequence[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--backbone-opt: expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jagg eval``."""
    parser.add_argument("--backbone", default="tiny-shapes", help="backbone name (see jagg_engine.backbones)")
    parser.add_argument("--reward", default="shapes", help="reward name (see jagg_engine.rewards)")
    parser.add_argument(
        "--prompts", type=Path, default=None, help="file with one prompt a line (default: 64 fixed)"
    )
    parser.add_argument("--seeds", type=int, default=4, help="noise seeds per prompt")
    parser.add_argument("--steps", type=int, default=20, help="Euler ODE steps")
    parser.add_argument("--shift", type=float, default=1.0, help="time shift of the σ grid (1 = uniform)")
    parser.add_argument(
        "--schedule",
        choices=("shifted-linear", "pipeline"),
        default="shifted-linear",
        help="σ grid: shifted-linear (uniform, then --shift) or pipeline (the diffusers pipeline's scheduler)",
    )
    parser.add_argument(
        "--cfg-scale", type=float, default=None, help="classifier-free guidance (tiny-shapes)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="auto", help="cpu, cuda, … (auto: cuda when available)")
    parser.add_argument(
        "--backbone-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra backbone option, repeatable",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/eval"), help="output directory")


def _fail(message: str) -> int:
    print(f"jagg eval: {message}", file=sys.stderr)
    return 2


def _load_prompts(path: Path | None) -> list[str]:
    if path is None:
        return eval_prompts()
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def run(args: argparse.Namespace) -> int:
    """Sample, score, print and write; returns the exit code (2 on bad input, one line on stderr)."""
    from .backbones import BACKBONES, BackboneConfigError, build_backbone
    from .rewards.registry import RewardConfigError, build_reward, check_reward

    if args.backbone not in BACKBONES:
        return _fail(f"unknown backbone {args.backbone!r}; allowed: {', '.join(BACKBONES)}")
    try:
        check_reward(args.reward)
    except RewardConfigError as exc:
        return _fail(str(exc))
    if args.seeds <= 0:
        return _fail(f"--seeds must be > 0, got {args.seeds}")
    if args.steps <= 0:
        return _fail(f"--steps must be > 0, got {args.steps}")
    if args.batch_size <= 0:
        return _fail(f"--batch-size must be > 0, got {args.batch_size}")
    if args.prompts is not None and not args.prompts.is_file():
        return _fail(f"prompts file not found: {args.prompts}")
    prompts = _load_prompts(args.prompts)
    if not prompts:
        return _fail(f"no prompts in {args.prompts}")
    try:
        options = _parse_options(args.backbone_opt)
    except ValueError as exc:
        return _fail(str(exc))
    if args.cfg_scale is not None:
        options["cfg_scale"] = args.cfg_scale
    device = resolve_device(args.device)

    try:
        model = build_backbone(args.backbone, **options)
        reward = build_reward(args.reward)
    except (BackboneConfigError, RewardConfigError, TypeError) as exc:
        return _fail(str(exc).splitlines()[0])
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()

    schedule = None
    if args.schedule == "pipeline":
        if not hasattr(model, "pipeline_sigmas"):
            return _fail(
                f"--schedule: backbone {args.backbone!r} has no diffusers pipeline scheduler; use shifted-linear"
            )
        if args.shift != 1.0:
            return _fail(
                "--shift: the pipeline schedule takes its shift from the model's scheduler; leave it at 1"
            )
        schedule = tuple(float(x) for x in model.pipeline_sigmas(args.steps))
    try:
        result = sample_and_score(
            model,
            reward,
            prompts,
            args.seeds,
            args.steps,
            args.shift,
            args.batch_size,
            device,
            components=args.reward.startswith("shapes"),
            schedule=schedule,
        )
    except ValueError as exc:  # e.g. a prompt word outside a closed vocabulary
        return _fail(str(exc).splitlines()[0])
    pairs = [(i, s) for i in range(len(prompts)) for s in range(args.seeds)]  # prompt-major
    elapsed = result.seconds
    score = result.scores  # (P·S,)
    summary: dict[str, object] = {
        "backbone": args.backbone,
        "reward": args.reward,
        "backbone_options": {k: repr(v) for k, v in options.items()},
        "num_prompts": len(prompts),
        "seeds": args.seeds,
        "steps": args.steps,
        "shift": args.shift,
        "schedule": args.schedule,
        "mean": score.mean().item(),
        "std": score.std(unbiased=False).item(),
        "seconds": elapsed,
    }
    lines = [
        f"{args.reward}: {summary['mean']:.3f} ± {summary['std']:.3f} ({len(score)} samples, {elapsed:.0f} s)"
    ]
    if result.components is not None:
        per = result.components
        summary["components"] = {
            k: {"mean": v.mean().item(), "std": v.std(unbiased=False).item()} for k, v in per.items()
        }
        lines.append(
            "  " + ", ".join(f"{k} {v.mean():.3f} ± {v.std(unbiased=False):.3f}" for k, v in per.items())
        )
        by_shape = {}
        for shape in shapes_data.SHAPES:
            mask = torch.tensor([prompts[i].split()[1:2] == [shape] for i, _ in pairs])
            if mask.any():
                by_shape[shape] = per["shape"][mask].mean().item()
        summary["shape_accuracy_by_shape"] = by_shape
        lines.append("  shape accuracy by shape: " + ", ".join(f"{k} {v:.2f}" for k, v in by_shape.items()))
    per_prompt = score.reshape(len(prompts), args.seeds).mean(dim=1)
    summary["per_prompt"] = {p: per_prompt[i].item() for i, p in enumerate(prompts)}

    from PIL import Image

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_images = result.images  # (P·S, H, W, 3)
    columns = args.seeds * max(1, 16 // args.seeds)
    scale = max(1, 128 // all_images.shape[1])
    Image.fromarray(image_grid(all_images, columns, scale)).save(out / "grid.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'grid.png'} and {out / 'summary.json'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (``python -m jagg_engine.evaluate``), the same flags as ``jagg eval``."""
    parser = argparse.ArgumentParser(prog="jagg eval", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
