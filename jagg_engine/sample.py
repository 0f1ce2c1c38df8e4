"""`jagg sample`: images of typed prompts from a run's weights, an export or a base model, each with its reward.

    jagg sample RUN [--step N] --prompt TEXT [TEXT ...] --seeds 0,1 --out grid.png    a run at a checkpoint
    jagg sample RUN --prompts-file prompts.json ...   the prompts as a JSON list of strings instead
    jagg sample RUN --with-base ...        the run's base model and its weights side by side, from the same noise
    jagg sample RUN --base ...             the run's base model (its step 0)
    jagg sample --model DIR ...            an export of `jagg export-model`
    jagg sample --base [--backbone NAME]   a backbone's default weights

Sampling is the eval's (:func:`jagg_engine.evaluate.evaluate_run_settings`): the deterministic ODE of the run's
sampling steps and schedule from the fixed noise of (prompt i, seed s), so the same prompt and seed start from
the same noise under every model, scored by the run's weighted rewards (``--reward`` for another). The grid
has one row per prompt and one column per seed (with ``--with-base``: the base's seeds, then the run's), each
image captioned with its seed and reward; ``--json`` prints one object with every image's reward (and, with
``--images DIR``, the path of each image written alone); ``--progress`` names each phase on stderr (the app's
Try it tab shows them).

``--prompts-file`` is how a program passes text it did not write (the app's Try it tab passes what a visitor
typed): a prompt there is only ever a prompt, while a word of ``--prompt`` that starts with ``-`` would be read
as another flag (``--reward``, ``--steps``, ``--device`` …).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jagg sample``."""
    parser.add_argument(
        "run_id", nargs="?", type=int, default=None, metavar="RUN", help="run id (`jagg runs`)"
    )
    parser.add_argument(
        "--step", type=int, default=None, help="with RUN: checkpoint step (default: the last)"
    )
    parser.add_argument(
        "--model", type=Path, default=None, metavar="DIR", help="an export of `jagg export-model`"
    )
    parser.add_argument(
        "--base", action="store_true", help="the base model (RUN's, else --backbone's default)"
    )
    parser.add_argument(
        "--with-base",
        action="store_true",
        help="with RUN or --model: the base model beside, from the same noise",
    )
    parser.add_argument("--backbone", default="tiny-shapes", help="with --base alone: the backbone")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", nargs="+", metavar="TEXT", help="prompts, one image row each")
    prompts.add_argument(
        "--prompts-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the prompts as a JSON list of strings (text that must never read as a flag)",
    )
    parser.add_argument("--seeds", default="0", help="noise seeds, a list like 0,1 (default 0)")
    parser.add_argument(
        "--steps", type=int, default=None, help="ODE steps (default: the run's sampling_steps)"
    )
    parser.add_argument("--reward", default=None, help="score with this reward instead of the run's")
    parser.add_argument("--out", type=Path, required=True, help="the grid PNG to write")
    parser.add_argument("--runs-dir", default="runs", help="runs root holding jagg.db (default: runs)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, … (auto: cuda when available)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every image's reward")
    parser.add_argument(
        "--images",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write each image as its own PNG into this folder (its path in --json)",
    )
    parser.add_argument(
        "--progress", action="store_true", help="print one 'progress: …' line to stderr as each phase starts"
    )


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--seeds: must be a list of whole numbers like 0,1, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds: must be distinct whole numbers >= 0 like 0,1, got {text!r}")
    return seeds


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of ``--prompt`` or of ``--prompts-file`` (a JSON list of strings); UsageError in one line."""
    if args.prompts_file is None:
        return list(args.prompt)
    path = Path(args.prompts_file)
    try:
        prompts = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--prompts-file: cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"--prompts-file: {path} is not JSON ({type(exc).__name__})") from None
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise UsageError(f"--prompts-file: {path} must hold a non-empty JSON list of strings")
    return prompts


def resolve_models(args: argparse.Namespace, device: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """The config of the sampling settings and the models to sample, each with its label."""
    from .export import asked_step, build_model, load_run_model, model_config, open_run
    from .train.config import ConfigError, TrainConfig

    given = [args.run_id is not None, args.model is not None]
    if sum(given) > 1:
        raise UsageError("RUN: give a RUN or --model, not both")
    if not any(given) and not args.base:
        raise UsageError("RUN: give a RUN, --model DIR or --base")
    if args.step is not None and args.run_id is None:
        raise UsageError("--step: only with a RUN")
    if args.with_base and (args.base or not any(given)):
        raise UsageError("--with-base: with a RUN or --model (and without --base)")
    if args.model is not None:
        if args.base:
            raise UsageError("--base: with --model, use --with-base to see the base beside the export")
        cfg, info = model_config(args.model)
        models = [(f"export step {info['step']}", build_model(cfg, device))]
        if args.with_base:
            base_cfg = TrainConfig.from_dict(info["config"])
            models.insert(0, ("base", build_model(dataclasses.replace(base_cfg, beta=0.0), device)))
        return cfg, models
    if args.run_id is not None:
        run = open_run(args.runs_dir, args.run_id)
        if args.base:
            return run.cfg, [("base", load_run_model(run, 0, device))]
        step = asked_step(run, args.step)
        models = [(f"run {run.id} step {step}", load_run_model(run, step, device))]
        if args.with_base:
            models.insert(0, ("base", load_run_model(run, 0, device)))
        return run.cfg, models
    try:
        cfg = TrainConfig(backbone=args.backbone)
        cfg._backbone_spec()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return cfg, [("base", build_model(cfg, device))]


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """Sample every model on the prompts × seeds, write the grid, return the summary (see the module doc)."""
    from PIL import Image

    from .devices import resolve_device
    from .evaluate import evaluate_run_settings
    from .rewards.registry import RewardConfigError, WeightedReward, check_reward
    from .train.trainer import pipeline_schedule

    flag = "--prompts-file" if args.prompts_file is not None else "--prompt"
    prompts = [p.strip() for p in read_prompts(args)]
    if not all(prompts):
        raise UsageError(f"{flag}: a prompt must not be empty")
    seeds = _seeds(args.seeds)
    if args.steps is not None and args.steps <= 0:
        raise UsageError(f"--steps: must be > 0, got {args.steps}")
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out: must name a .png file, got {str(out)!r}")
    if not out.absolute().parent.is_dir():
        raise UsageError(f"--out: {out.absolute().parent} is not a folder")
    images_dir = Path(args.images) if args.images is not None else None
    if images_dir is not None and not images_dir.is_dir():
        raise UsageError(f"--images: {images_dir} is not a folder")
    device = resolve_device(args.device)
    _progress(args, "loading the models")
    cfg, models = resolve_models(args, device)
    if args.steps is not None:
        cfg = dataclasses.replace(cfg, sampling_steps=args.steps)
    rewards, options = dict(cfg.rewards), dict(cfg.reward_options)
    try:
        if args.reward is not None:
            check_reward(args.reward)
            rewards, options = {args.reward: 1.0}, {}
        reward = WeightedReward(rewards, options)
    except RewardConfigError as exc:
        raise UsageError(f"--reward: {exc}") from None
    results = []
    for n, (label, model) in enumerate(models, 1):
        _progress(args, f"sampling {label} ({n} of {len(models)})")
        try:
            schedule = pipeline_schedule(cfg, model)
            result = evaluate_run_settings(
                model, reward, prompts, seeds, cfg.sampling_steps, cfg.shift, schedule, device
            )
        except ValueError as exc:  # e.g. a word outside tiny-shapes' closed vocabulary
            raise UsageError(f"{flag}: {str(exc).splitlines()[0]}") from None
        results.append((label, result))
    grid = captioned_grid(
        prompts, seeds, [(label, r.images.numpy(), r.totals.tolist()) for label, r in results]
    )
    _progress(args, "writing the images")
    _save_png(grid, out)
    paths: list[list[str | None]] = [[None] * len(r.prompts) for _, r in results]
    if images_dir is not None:
        for b, (_, r) in enumerate(results):
            for k, s in enumerate(r.seeds):  # seed-major: prompt k % P
                path = images_dir / f"model{b}_prompt{k % len(prompts)}_seed{s}.png"
                _save_png(Image.fromarray(r.images[k].numpy()), path)
                paths[b][k] = str(path)
    return {
        "out": str(out),
        "sampling_steps": cfg.sampling_steps,
        "reward_weights": rewards,
        "models": [
            {
                "label": label,
                "reward_mean": float(r.totals.mean()),
                "images": [
                    {"prompt": p, "seed": s, "reward": float(v), **({"path": path} if path else {})}
                    for p, s, v, path in zip(r.prompts, r.seeds, r.totals, paths[b])
                ],
            }
            for b, (label, r) in enumerate(results)
        ],
    }


def _progress(args: argparse.Namespace, phase: str) -> None:
    if getattr(args, "progress", False):
        print(f"progress: {phase}", file=sys.stderr, flush=True)


def _save_png(image: Any, path: Path) -> None:
    """``image`` as ``path`` whole or not at all (written beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        image.save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def captioned_grid(
    prompts: Sequence[str], seeds: Sequence[int], blocks: Sequence[tuple[str, np.ndarray, Sequence[float]]]
) -> Any:
    """One PIL image: a row per prompt, a column per (model, seed), each image captioned "seed s: reward"; a
    header names each model's columns. ``blocks``: (label, images (S·P, H, W, 3) seed-major, rewards (S·P,))."""
    from PIL import Image, ImageDraw

    n_p, n_s = len(prompts), len(seeds)
    h, w = blocks[0][1].shape[1:3]
    scale = max(1, 128 // max(h, w))
    cell_w, cell_h, cap, head, label_w = w * scale, h * scale, 16, 18, 150
    cols = len(blocks) * n_s
    width = label_w + cols * (cell_w + 6) + 6
    height = head + n_p * (cell_h + cap + 6) + 6
    grid = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(grid)
    for b, (label, images, rewards) in enumerate(blocks):
        draw.text((label_w + b * n_s * (cell_w + 6) + 6, 3), label, fill="black")
        for si, seed in enumerate(seeds):
            for pi in range(n_p):
                k = si * n_p + pi  # seed-major
                x = label_w + (b * n_s + si) * (cell_w + 6) + 6
                y = head + pi * (cell_h + cap + 6)
                picture = Image.fromarray(images[k]).resize((cell_w, cell_h), Image.NEAREST)
                grid.paste(picture, (x, y))
                draw.text((x, y + cell_h + 2), f"seed {seed}: {rewards[k]:.3f}", fill="black")
    for pi, prompt in enumerate(prompts):
        draw.text((4, head + pi * (cell_h + cap + 6) + cell_h // 2 - 6), prompt[:24], fill="black")
    return grid


def run(args: argparse.Namespace) -> int:
    summary = sample(args)
    if args.json:
        print(json.dumps(summary))
        return 0
    for model in summary["models"]:
        print(f"{model['label']}: mean reward {model['reward_mean']:.4f}")
        for image in model["images"]:
            print(f"  seed {image['seed']}  {image['reward']:.4f}  {image['prompt']}")
    print(f"wrote {summary['out']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jagg_engine.sample`` (the app's Try it worker): the flags of ``jagg sample``."""
    from .cli import main as cli_main

    return cli_main(["sample", *(argv if argv is not None else __import__("sys").argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
