"""`jagg eval`: deterministic ODE samples of fixed prompts × seeds, scored by a reward, with a grid and a JSON.

    jagg eval --backbone tiny-shapes --reward shapes [--prompts FILE] [--seeds 4] [--steps 20] [--out DIR]
    jagg eval --run RUN [--step N] [--runs-dir DIR] [--json]     a run's weights at a checkpoint (or step 0)
    jagg eval --model DIR [--json]                               an export of `jagg export-model`

With ``--run`` or ``--model`` the eval is the run's own (:func:`evaluate_run_settings`, the trainer's eval:
its eval prompts, eval seeds, sampling steps, schedule and weighted rewards), unless ``--prompts``,
``--seeds``, ``--steps``, ``--shift``, ``--schedule`` or ``--reward`` override them; on the same settings the
mean equals the run's logged ``eval/reward/mean`` at that step. ``--json`` prints one object.

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
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from . import shapes_data
from .backbones.base import Backbone
from .devices import resolve_device
from .imaging import image_grid
from .sde import eval_noise, ode_sample

DEFAULT_NUM_PROMPTS = 64


def eval_prompts(n: int = DEFAULT_NUM_PROMPTS) -> list[str]:
    """``n`` fixed prompts out of the 90 shapes captions (a seeded permutation, the same on every machine)."""
    prompts = shapes_data.all_prompts()
    order = np.random.default_rng(0).permutation(len(prompts))[:n]
    return [prompts[i] for i in sorted(order)]


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


class RunEval(NamedTuple):
    """The trainer's eval of a model, seed-major: sample k is prompt k % P with seed ``seeds[k // P]``."""

    images: torch.Tensor  # (S·P, H, W, 3) uint8
    prompts: list[str]  # (S·P,)
    seeds: list[int]  # (S·P,)
    totals: torch.Tensor  # (S·P,) the weighted reward
    parts: dict[str, torch.Tensor]  # reward name → (S·P,)
    seconds: float

    def summary(self) -> dict[str, Any]:
        """reward_mean, reward_std (population, as the trainer logs it) and each reward's mean."""
        return {
            "reward_mean": float(self.totals.mean()),
            "reward_std": float(self.totals.std(unbiased=False)),
            "rewards": {k: float(v.mean()) for k, v in self.parts.items()},
            "samples": len(self.totals),
        }


@torch.no_grad()
def evaluate_run_settings(
    model: Any,
    reward: Callable[[torch.Tensor, list[str]], tuple[torch.Tensor, dict[str, torch.Tensor]]],
    prompts: Sequence[str],
    seeds: Sequence[int],
    steps: int,
    shift: float,
    schedule: tuple[float, ...] | None,
    device: str | torch.device = "cpu",
    batch_size: int = 64,
) -> RunEval:
    """The trainer's eval (:meth:`jagg_engine.train.trainer.Trainer.evaluate`), sample for sample: every prompt
    under each seed, seed-major, the noise of (prompt i, seed s) from :func:`eval_noise` in the dtype of the
    trained parameters, ODE samples in chunks of ``batch_size``, scored by the weighted ``reward``."""
    start = time.time()
    all_prompts = [p for _ in seeds for p in prompts]
    all_seeds = [s for s in seeds for _ in prompts]
    index = list(range(len(prompts))) * len(seeds)
    noise = torch.stack([eval_noise(model.latent_shape, i, s) for i, s in zip(index, all_seeds)])
    dtype = model.trainable_parameters()[0].dtype
    images, totals, parts = [], [], []
    for i in range(0, len(all_prompts), batch_size):
        chunk = all_prompts[i : i + batch_size]
        z = ode_sample(
            model,
            model.encode_prompts(chunk),
            noise[i : i + batch_size].to(device, dtype),
            steps,
            shift,
            schedule,
        )
        img = model.decode(z)
        total, part = reward(img, chunk)
        images.append(img)
        totals.append(total)
        parts.append(part)
    merged = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return RunEval(torch.cat(images), all_prompts, all_seeds, torch.cat(totals), merged, time.time() - start)


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
    parser.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="RUN",
        help="evaluate run RUN's weights with its eval settings",
    )
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="with --run: the checkpoint's step (0 = base; default: the last)",
    )
    parser.add_argument("--runs-dir", default="runs", help="with --run: runs root holding jagg.db")
    parser.add_argument(
        "--model", type=Path, default=None, metavar="DIR", help="evaluate an export of `jagg export-model`"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--backbone", default="tiny-shapes", help="backbone name (see jagg_engine.backbones)")
    parser.add_argument(
        "--reward", default=None, help="reward name (see jagg_engine.rewards; default shapes, or the run's)"
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="file with one prompt a line (default: 64 fixed, or the run's)",
    )
    parser.add_argument(
        "--seeds", default=None, help="noise seeds per prompt: a count N (0 … N-1) or a list 0,3 (default 4)"
    )
    parser.add_argument("--steps", type=int, default=None, help="Euler ODE steps (default 20, or the run's)")
    parser.add_argument(
        "--shift", type=float, default=None, help="time shift of the σ grid (1 = uniform; default: the run's)"
    )
    parser.add_argument(
        "--schedule",
        choices=("shifted-linear", "pipeline"),
        default=None,
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
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default runs/eval; with --run/--model: none)",
    )


def _fail(message: str) -> int:
    print(f"jagg eval: error: {message}", file=sys.stderr)
    return 2


def _load_prompts(path: Path | None) -> list[str]:
    if path is None:
        return eval_prompts()
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def parse_seeds(text: str | None, default: Sequence[int]) -> list[int]:
    """``--seeds``: a count N (seeds 0 … N-1) or a comma list of distinct whole numbers >= 0."""
    if text is None:
        return list(default)
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--seeds must be a count or a list like 0,1, got {text!r}") from None
    if len(values) == 1 and "," not in str(text):
        if values[0] <= 0:
            raise ValueError(f"--seeds must be > 0, got {values[0]}")
        return list(range(values[0]))
    if any(v < 0 for v in values) or len(set(values)) != len(values):
        raise ValueError(f"--seeds must list distinct whole numbers >= 0, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    """Sample, score, print and write; returns the exit code (2 on bad input, one line on stderr)."""
    from .backbones import BACKBONES, BackboneConfigError, build_backbone
    from .rewards.registry import RewardConfigError, build_reward, check_reward

    if args.run is not None or args.model is not None:
        from .errors import UsageError

        try:
            return run_model(args)
        except UsageError as exc:
            return _fail(str(exc))
    if args.step is not None:
        return _fail("--step: only with --run")
    args.reward = args.reward or "shapes"
    args.steps = 20 if args.steps is None else args.steps
    args.shift = 1.0 if args.shift is None else args.shift
    args.schedule = args.schedule or "shifted-linear"
    args.out = Path("runs/eval") if args.out is None else args.out
    try:
        args.seeds = int(args.seeds) if args.seeds is not None else 4
    except ValueError:
        return _fail(f"--seeds: with --backbone a count of seeds, got {args.seeds!r}")
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


def resolve_model(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """The config, model and description of ``--run RUN [--step N]`` or ``--model DIR`` (UsageError, one line,
    on bad input). The description names the run, the step and the eval reward the run logged there."""
    from .errors import UsageError
    from .export import asked_step, load_run_model, model_config, open_run

    device = resolve_device(args.device)
    if args.run is not None and args.model is not None:
        raise UsageError("--model: give --run or --model, not both")
    if args.model is not None:
        if args.step is not None:
            raise UsageError("--step: an export holds one step; leave --step out with --model")
        cfg, info = model_config(args.model)
        from .export import build_model

        model = build_model(cfg, device)
        logged = info.get("eval_reward", {}).get("after", {})
        where = {"model": str(args.model), "run": info["run"].get("id"), "step": info["step"]}
        if logged.get("step") == info["step"]:
            where["logged_eval_reward_mean"] = logged.get("mean")
        return cfg, model, {**where, "eval_prompts": info["eval"]["prompts"]}
    if args.run < 1:
        raise UsageError(f"--run: must be a run id >= 1, got {args.run}")
    run = open_run(args.runs_dir, args.run)
    step = asked_step(run, args.step)
    model = load_run_model(run, step, device)
    from .store import open_store

    with open_store(args.runs_dir) as store:
        frame = store.metrics_frame(run.id)
    where: dict[str, Any] = {"run": run.id, "step": step}
    key = "eval/reward/mean"
    if not frame.empty and key in frame:
        rows = frame.loc[(frame["step"] == step) & frame[key].notna(), key]
        if not rows.empty:
            where["logged_eval_reward_mean"] = float(rows.iloc[0])
    return run.cfg, model, where


def run_model(args: argparse.Namespace) -> int:
    """``jagg eval --run`` / ``--model``: the run's eval settings, overridden by the flags given."""
    from .errors import UsageError
    from .rewards.registry import RewardConfigError, WeightedReward, check_reward
    from .train.trainer import pipeline_schedule, prompt_source

    cfg, model, where = resolve_model(args)
    device = resolve_device(args.device)
    try:
        seeds = parse_seeds(args.seeds, cfg.eval_seeds)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.prompts is not None:
        if not args.prompts.is_file():
            raise UsageError(f"--prompts: prompts file not found: {args.prompts}")
        prompts = _load_prompts(args.prompts)
    elif "eval_prompts" in where:
        prompts = list(where.pop("eval_prompts"))
    else:
        try:
            prompts = prompt_source(cfg, eval_set=True)[: cfg.eval_num_prompts]
        except ValueError as exc:
            raise UsageError(f"--run: the run's eval prompts cannot be read here: {exc}") from None
    if not prompts:
        raise UsageError("--prompts: no prompts")
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be > 0, got {value}")
    steps = cfg.sampling_steps if args.steps is None else args.steps
    shift = cfg.shift if args.shift is None else args.shift
    schedule_name = args.schedule or cfg.resolved_schedule()
    cfg = dataclasses.replace(cfg, sampling_steps=steps, shift=shift, schedule=schedule_name)
    if schedule_name == "pipeline" and not hasattr(model, "pipeline_sigmas"):
        raise UsageError(f"--schedule: backbone {cfg.backbone!r} has no diffusers pipeline scheduler")
    if schedule_name == "pipeline" and shift != 1.0:
        raise UsageError(
            "--shift: the pipeline schedule takes its shift from the model's scheduler; leave it at 1"
        )
    rewards, options = dict(cfg.rewards), dict(cfg.reward_options)
    if args.reward is not None:
        try:
            check_reward(args.reward)
        except RewardConfigError as exc:
            raise UsageError(str(exc)) from None
        rewards, options = {args.reward: 1.0}, {}
    try:
        reward = WeightedReward(rewards, options)
        result = evaluate_run_settings(
            model,
            reward,
            prompts,
            seeds,
            steps,
            shift,
            pipeline_schedule(cfg, model),
            device,
            args.batch_size,
        )
    except (RewardConfigError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    summary = {
        **where,
        **result.summary(),
        "prompts": len(prompts),
        "seeds": seeds,
        "sampling_steps": steps,
        "schedule": schedule_name,
        "shift": shift,
        "reward_weights": rewards,
        "seconds": result.seconds,
    }
    if args.out is not None:
        from PIL import Image

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        images = result.images.numpy()
        scale = max(1, 128 // images.shape[1])
        Image.fromarray(image_grid(images, len(prompts) if len(prompts) <= 16 else 16, scale)).save(
            out / "grid.png"
        )
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary))
        return 0
    what = f"run {where['run']} step {where['step']}" if args.model is None else f"{args.model}"
    print(
        f"{what}: reward {summary['reward_mean']:.4f} ± {summary['reward_std']:.4f} ({summary['samples']} samples,"
        f" {result.seconds:.0f} s); " + ", ".join(f"{k} {v:.4f}" for k, v in summary["rewards"].items())
    )
    if "logged_eval_reward_mean" in where:
        print(f"logged eval/reward/mean at step {where['step']}: {where['logged_eval_reward_mean']:.4f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (``python -m jagg_engine.evaluate``), the same flags as ``jagg eval``."""
    parser = argparse.ArgumentParser(prog="jagg eval", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
