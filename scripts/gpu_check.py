"""GPU check: FLUX.1-dev and SD3.5-medium transformers at their published sizes, no download, one command.

    python scripts/gpu_check.py                  # one CUDA GPU; about 6 minutes on an H200, 8 at most
    python scripts/gpu_check.py --help

What it does, for each model (SD3.5-medium first, the cheaper one, then FLUX.1-dev):

1. builds the diffusers transformer from its published config (``FLUX_DEV_CONFIG``, ``SD35_MEDIUM_CONFIG``)
   with seeded random bf16 weights, LoRA on the attention projections (rank and α of the shipped config:
   ``configs/flux-lora.yaml``, ``configs/sd3-lora.yaml``) and gradient checkpointing, at 512 px
   (FLUX: 32×32 packed tokens + 512 text tokens; SD3.5: 64×64 latents, 2×2 patches, 333 text tokens and
   classifier-free guidance 4.5, i.e. batches of 2B, as the sd3-lora config samples). Text embeddings are
   seeded random tensors: no text encoder, no VAE, no network;
2. measures the update phase with `jagg bench`'s harness (:func:`jagg_engine.bench.bench_backbone`, the
   engine's ``policy_update``): exact, jagg and jagg+reuse at W = 4 on one group (4 trained steps) of a
   batch of 4, for train_micro_batch 1, 2 and 4 — update time per group (median of interleaved rounds), r,
   peak CUDA memory and peak saved-activation bytes, measured vs cost-model speedup;
3. trains 10 GRPO steps with a cheap reward (the mean of the final latent; no decoder): rollout, group
   advantages, ``policy_update`` (jagg, reuse on, the micro-batch of the shipped config), AdamW — the
   engine calls the trainer makes, without the run store;
4. trains the windowed variant as many steps (``train_windowed``; ``configs/flux-mixgrpo.yaml``'s schedule
   on W + 4 sampling steps): a sliding SDE window of W steps moving one step a training step, one JAGG group
   with reuse, a shared initial noise per group whose steps before the window are sampled once, dpmpp-2m
   after the window; each row adds the window and the sampling forwards.

Everything lands in ``--out`` (default ``reports/gpu/``) as ``gpu-check.json``, rewritten atomically after
every phase, so a run cut short still leaves its results. ``--budget-s`` (default 360) stops starting new
phases once spent. ``--depth``, ``--heads``, ``--resolution``, ``--text-len`` and ``--device cpu`` exist for
the CPU test of this script (tests/test_gpu_check.py), which runs it end to end on both models at depth 1,
narrowed, in float32, and counts the parameters of the published configs built on the meta device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from jagg_engine.backbones.base import Cond, hashed_prompt_embeddings  # noqa: E402
from jagg_engine.backbones.common import ATTENTION_PROJECTIONS, add_lora  # noqa: E402
from jagg_engine.backbones.flux_core import FLUX_DEV_CONFIG, FluxVelocity  # noqa: E402
from jagg_engine.backbones.sd3 import sd3_velocity  # noqa: E402
from jagg_engine.bench import bench_backbone  # noqa: E402
from jagg_engine.devices import default_dtype  # noqa: E402
from jagg_engine.grpo import group_advantages  # noqa: E402
from jagg_engine.jagg import UpdateConfig, policy_update  # noqa: E402
from jagg_engine.sde import SamplerConfig, rollout, sliding_window  # noqa: E402
from jagg_engine.streams import torch_stream  # noqa: E402

# SD3Transformer2DModel of stabilityai/stable-diffusion-3.5-medium (transformer/config.json): 2.2 B parameters.
SD35_MEDIUM_CONFIG: dict[str, Any] = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)


@dataclass(frozen=True)
class CheckSpec:
    """One model of the check and the training setting of its shipped config."""

    name: str
    config_file: str  # the shipped config whose LoRA, sampler and micro-batch the check uses
    lora_rank: int
    lora_alpha: float
    text_len: int  # text tokens at the pipeline's defaults
    cfg_scale: float  # > 1: classifier-free guidance, one batch of 2B per call
    algorithm: str
    eta: float
    lr: float
    train_micro_batch: int


def _spec(name: str, config_file: str, text_len: int, guided: bool) -> CheckSpec:
    """The check's setting read from the shipped config (one source: change the YAML, the check follows)."""
    cfg = yaml.safe_load((ROOT / config_file).read_text(encoding="utf-8"))
    return CheckSpec(
        name=name,
        config_file=config_file,
        lora_rank=int(cfg["lora_rank"]),
        lora_alpha=float(cfg["lora_alpha"]),
        text_len=text_len,
        cfg_scale=float(cfg["cfg_scale"]) if guided else 1.0,  # FLUX.1-dev's is a guidance embedding, one row
        algorithm=str(cfg["algorithm"]),
        eta=float(cfg["eta"]),
        lr=float(cfg["lr"]),
        train_micro_batch=int(cfg["train_micro_batch"]),
    )


SPECS = {
    "sd3.5-medium": _spec("sd3.5-medium", "configs/sd3-lora.yaml", 77 + 256, guided=True),
    "flux-dev": _spec("flux-dev", "configs/flux-lora.yaml", 512, guided=False),
}


def published_config(name: str, depth: int | None = None, heads: int | None = None) -> dict[str, Any]:
    """The published transformer config of ``name``, with two overrides for the CPU test of this script:
    ``depth`` d keeps d joint blocks (and, for FLUX, 2d single blocks, the published 19 : 38 ratio; for SD3.5,
    dual attention in the first min(d, 13)); ``heads`` h narrows the model to h attention heads."""
    if name not in SPECS:
        raise ValueError(f"model: must be one of {', '.join(SPECS)}, got {name!r}")
    config = dict(FLUX_DEV_CONFIG if name == "flux-dev" else SD35_MEDIUM_CONFIG)
    if depth is not None:
        if depth < 1:
            raise ValueError(f"depth: must be an integer >= 1, got {depth}")
        config["num_layers"] = min(depth, config["num_layers"])
        if name == "flux-dev":
            config["num_single_layers"] = min(2 * depth, config["num_single_layers"])
        else:
            config["dual_attention_layers"] = tuple(range(min(depth, 13)))
    if heads is not None:
        if heads < 1:
            raise ValueError(f"heads: must be an integer >= 1, got {heads}")
        config["num_attention_heads"] = heads
        if name == "sd3.5-medium":  # the caption projection is the model width
            config["caption_projection_dim"] = heads * config["attention_head_dim"]
    return config


class CheckModel(torch.nn.Module):
    """A published transformer with random weights as the engine's velocity callable (the Backbone protocol
    minus decode): LoRA weights trained, bf16 autocast on a GPU as the diffusers backbones do.

    FLUX: z (B, N, 64) packed tokens, cond {"prompt_embeds": (B, L, 4096), "pooled": (B, 768)}, velocity by
    :class:`~jagg_engine.backbones.flux_core.FluxVelocity` (the `flux` backbone's). SD3.5: z (B, 16, h, w),
    cond adds the negative prompt's embeddings when cfg_scale > 1; velocity by
    :func:`~jagg_engine.backbones.sd3.sd3_velocity` (the `sd3` backbone's).
    """

    def __init__(self, spec: CheckSpec, transformer: torch.nn.Module, resolution: int, text_len: int):
        super().__init__()
        self.spec, self.name, self.text_len = spec, spec.name, text_len
        self.transformer = transformer
        if spec.name == "flux-dev":
            side = resolution // 16  # VAE ÷ 8, then 2×2 packing
            self.flux = FluxVelocity(transformer, (side, side), text_len, guidance=3.5)
            self.flux.to(next(transformer.parameters()).device)  # its position ids beside the weights
            self.latent_shape: tuple[int, ...] = self.flux.latent_shape
        else:
            side = resolution // 8
            self.latent_shape = (transformer.config.in_channels, side, side)
        self.cuda_autocast = next(transformer.parameters()).device.type == "cuda"

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: Cond) -> torch.Tensor:
        dtype = self.transformer.dtype
        with torch.autocast("cuda", dtype=dtype, enabled=self.cuda_autocast and dtype != torch.float32):
            if self.spec.name == "flux-dev":
                v = self.flux(z, t, cond)
            else:
                v = sd3_velocity(self.transformer, z, t, cond, self.spec.cfg_scale)
        return v.to(z.dtype)

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        """Seeded random embeddings per prompt (no text encoder): the shapes the pipeline's encoders give."""
        cfg = self.transformer.config
        device, dtype = next(self.transformer.parameters()).device, self.transformer.dtype

        def embed(texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
            dims = (self.text_len, cfg.joint_attention_dim, cfg.pooled_projection_dim)
            return hashed_prompt_embeddings(texts, *dims)  # (B, L, D_joint), (B, D_pool)

        embeds, pooled = embed(prompts)
        cond = {"prompt_embeds": embeds.to(device, dtype), "pooled": pooled.to(device, dtype)}
        if self.spec.cfg_scale > 1:
            (neg_e,), (neg_p,) = embed([""])
            cond["negative_prompt_embeds"] = neg_e.expand(len(prompts), -1, -1).to(device, dtype).contiguous()
            cond["negative_pooled"] = neg_p.expand(len(prompts), -1).to(device, dtype).contiguous()
        return cond

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def build_check_model(
    name: str,
    depth: int | None = None,
    heads: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    resolution: int = 512,
    text_len: int | None = None,
    gradient_checkpointing: bool = True,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> CheckModel:
    """``name``'s published transformer (``depth``, ``heads``: see :func:`published_config`) with seeded random
    weights in ``dtype`` on ``device``, LoRA (float32) on the attention projections and, by default, gradient
    checkpointing. ``overrides``: further config entries (the activation estimate's block mix)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    config = {**published_config(name, depth, heads), **(overrides or {})}  # raises on an unknown name
    spec = SPECS[name]
    multiple = 16
    if resolution < multiple or resolution % multiple:
        raise ValueError(f"resolution: must be a positive multiple of {multiple}, got {resolution}")
    cls = FluxTransformer2DModel if name == "flux-dev" else SD3Transformer2DModel
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # weights are made in their final dtype: 24 GB for FLUX, not 48 + 24
    try:
        with torch.device(device):
            transformer = cls(**config)
    finally:
        torch.set_default_dtype(default)
    transformer.to(dtype).eval()  # float32 buffers (SD3's position table) too; eval: no dropout
    add_lora(transformer, spec.lora_rank, spec.lora_alpha, ATTENTION_PROJECTIONS)
    if gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    return CheckModel(spec, transformer, resolution, text_len or spec.text_len)


# ---------------------------------------------------------------------------------------------- phases


def measure(
    model: CheckModel, window: int, batch: int, micro_batch: int, repeats: int, seed: int
) -> dict[str, Any]:
    """exact, jagg and jagg+reuse on one group of ``window`` trained steps at ``micro_batch``: the bench report
    plus the update time per group."""
    report = bench_backbone(
        model.name,
        model,
        window=window,
        jagg_frac=1.0,
        batch=batch,
        steps=window,  # a rollout of W steps, all trained: one group
        repeats=repeats,
        seed=seed,
        clock="wall",
        micro_batch=micro_batch,
        strategies=("exact", "jagg", "jagg+reuse"),
    )
    groups = math.ceil(report["trained_steps"] / window)
    for row in report["strategies"].values():
        row["median_s_per_group"] = row["median_s"] / groups
    return report


def windowed_sampler(spec: CheckSpec, window: int, step: int) -> SamplerConfig:
    """The windowed variant's sampler at training step ``step`` (from 1), as configs/flux-mixgrpo.yaml samples
    at a smaller scale: T = W + 4 steps, a sliding SDE window of W steps (one shift a step, over the steps
    before the last two, MixGRPO's range), dpmpp-2m after the window at 2 steps."""
    num_steps = window + 4
    sde_window = sliding_window(step, 0, num_steps - 2 - window, window, 1, 1)
    return SamplerConfig(
        kind=spec.algorithm,
        num_steps=num_steps,
        eta=spec.eta,
        shift=3.0,
        sde_window=sde_window,
        ode_solver="dpmpp-2m",
        ode_steps_after=min(2, num_steps - sde_window[1]),
    )


def train(
    model: CheckModel,
    steps: int,
    batch: int,
    group_size: int,
    window: int,
    seed: int,
    budget_end: float,
    windowed: bool = False,
) -> list[dict[str, Any]]:
    """``steps`` GRPO steps with the latent-mean reward; one row per step (stops at ``budget_end``).

    ``windowed``: the sliding window of :func:`windowed_sampler` with a shared initial noise per group, whose
    steps before the window are sampled once per group (the rows add the window and the sampling forwards).
    """
    spec = model.spec
    params = model.trainable_parameters()
    device = params[0].device
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=1e-4)
    sampler = SamplerConfig(
        kind=spec.algorithm, num_steps=window + 2, eta=spec.eta, shift=3.0, sde_window=(0, window)
    )
    micro = min(spec.train_micro_batch, batch)
    update = UpdateConfig(
        strategy="jagg",
        window=window,
        clip_range=1e-4,
        reuse_rollout_velocity="auto",
        micro_batch=micro,
    )
    rows = []
    for step in range(steps):
        if time.perf_counter() > budget_end:
            break
        t0 = _now(device)
        gen = torch_stream(seed, step + 1, 0, "init_noise")  # the trainer's streams (jagg_engine.streams)
        prompts = [f"prompt {step}-{k}" for k in range(batch // group_size) for _ in range(group_size)]
        groups = torch.arange(batch // group_size).repeat_interleave(group_size)
        cond = model.encode_prompts(prompts)
        noise = torch.randn(batch, *model.latent_shape, generator=gen).to(device)
        if windowed:
            sampler = windowed_sampler(spec, window, step + 1)
            noise = noise[::group_size].repeat_interleave(group_size, 0)  # one noise per group
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sde_gen = torch_stream(seed, step + 1, 0, "sde_noise", device)  # drawn on the device, its own stream
        traj = rollout(
            model,
            cond,
            noise,
            sampler,
            generator=sde_gen,
            store_velocities=True,
            prefix_group=group_size if windowed else None,
        )
        t1 = _now(device)
        reward = traj.latents[-1].flatten(1).mean(dim=1).float().cpu()  # (B,) the cheap reward
        adv = group_advantages(reward, groups).to(device)
        result = policy_update(model, traj, adv, update, sampler)
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()  # bumps the parameters' version counters: the reuse guard sees a new policy
        opt.zero_grad(set_to_none=True)
        t2 = _now(device)
        row = {
            "step": step + 1,
            "reward_mean": float(reward.mean()),
            "loss": result.loss,
            "clipfrac": result.clipfrac,
            "grad_norm": norm,
            "reused": result.counts.reused,
            "rollout_s": t1 - t0,
            "update_s": t2 - t1,
            "step_s": t2 - t0,
        }
        if windowed:
            row.update(window=list(sampler.grid().window), sampling_forward=traj.forwards)
        if device.type == "cuda":
            row["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(device))
        rows.append(row)
        print(f"  train step {step + 1}: {json.dumps(row)}", flush=True)
    return rows


def _summary(report: dict[str, Any]) -> str:
    """One line per measured micro-batch: time per group, speedup (predicted), peak memory per strategy."""
    return ", ".join(
        f"{k} {v['median_s_per_group']:.3f} s/group x{v['speedup_vs_exact']:.2f} "
        f"(pred {v['predicted_speedup']:.2f}) {v['peak_mem_bytes'] / 2**30:.1f} GiB"
        for k, v in report["strategies"].items()
    )


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Report:
    """The JSON report, rewritten atomically (temporary file + rename) after every phase."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="FLUX.1-dev and SD3.5-medium (random weights, LoRA, gradient checkpointing, 512 px) on one "
        "GPU: update time, r, peak memory and speedups of exact / jagg / jagg+reuse at W = 4 for micro-batches "
        "1, 2, 4, then 10 training steps each. No downloads; writes gpu-check.json into --out.",
    )
    p.add_argument("--out", default="reports/gpu", help="output folder (default reports/gpu)")
    p.add_argument(
        "--models", default="sd3.5-medium,flux-dev", help=f"comma-separated, of {', '.join(SPECS)}"
    )
    p.add_argument("--micro-batches", default="1,2,4", help="train_micro_batch values to measure")
    p.add_argument("--batch", type=int, default=4, help="samples in the measured update (default 4)")
    p.add_argument("--window", type=int, default=4, help="W, trained steps of the measured group")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds after one warm-up round")
    p.add_argument("--train-steps", type=int, default=10, help="GRPO steps of the training phase per model")
    p.add_argument("--train-batch", type=int, default=4, help="samples per training step")
    p.add_argument("--group-size", type=int, default=2, help="samples per prompt in training")
    p.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="start no new phase after this many seconds (default 360)",
    )
    p.add_argument(
        "--cudnn-attention",
        action="store_true",
        help="let scaled_dot_product_attention use cuDNN's kernels (off by default: see main())",
    )
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run of the script)")
    p.add_argument(
        "--depth", type=int, default=None, help="joint blocks (tests); default: the published depth"
    )
    p.add_argument("--heads", type=int, default=None, help="attention heads (tests); default: the published")
    p.add_argument("--resolution", type=int, default=512, help="image side in pixels (default 512)")
    p.add_argument("--text-len", type=int, default=None, help="text tokens (default: 512 FLUX, 333 SD3.5)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.micro_batches = [int(m) for m in args.micro_batches.split(",") if m.strip()]
    for m in args.models:
        if m not in SPECS:
            p.error(f"models: must be among {', '.join(SPECS)}, got {m!r}")
    if any(not 1 <= m <= args.batch for m in args.micro_batches):
        p.error(f"micro-batches: each must be in 1..{args.batch} (--batch), got {args.micro_batches}")
    if args.train_batch % args.group_size or args.group_size < 2:
        p.error("group-size: must be >= 2 and divide --train-batch")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("device: no CUDA device here (--device cpu runs a dry run of the script)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    budget_end = start + args.budget_s
    device = torch.device(args.device)
    dtype = default_dtype(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        # FLUX.1-dev's backward hit an illegal memory access on an H200 (torch 2.11, cu130) with cuDNN's
        # attention enabled; the flash and memory-efficient kernels are the default here, cuDNN's on request.
        torch.backends.cuda.enable_cudnn_sdp(args.cudnn_attention)
    import diffusers
    import peft

    command = ["python", "scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
    versions = {"torch": torch.__version__, "diffusers": diffusers.__version__, "peft": peft.__version__}
    report = Report(
        Path(args.out) / "gpu-check.json",
        {
            "status": "running",
            "command": " ".join(command),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
            "dtype": str(dtype).removeprefix("torch."),
            "versions": {**versions, "cuda": torch.version.cuda},
            "args": vars(args),
            "models": {},
        },
    )
    try:
        for name in args.models:
            entry: dict[str, Any] = {"spec": asdict(SPECS[name]), "measure": [], "train": []}
            report.data["models"][name] = entry
            t0 = time.perf_counter()
            model = build_check_model(
                name, args.depth, args.heads, device, dtype, args.resolution, args.text_len, seed=args.seed
            )
            config = {k: v for k, v in model.transformer.config.items() if not k.startswith("_")}
            entry.update(
                config=json.loads(json.dumps(config, default=list)),
                params=sum(p.numel() for p in model.parameters()),
                trainable_params=sum(p.numel() for p in model.trainable_parameters()),
                latent_shape=list(model.latent_shape),
                text_len=model.text_len,
                build_s=time.perf_counter() - t0,
            )
            report.save()
            print(
                f"{name}: {entry['params'] / 1e9:.2f} B parameters, built in {entry['build_s']:.1f} s",
                flush=True,
            )
            for micro in args.micro_batches:
                if time.perf_counter() > budget_end:
                    entry["measure_skipped"] = (
                        f"budget of {args.budget_s:g} s spent before micro_batch {micro}"
                    )
                    break
                try:
                    entry["measure"].append(
                        measure(model, args.window, args.batch, micro, args.repeats, args.seed)
                    )
                except torch.cuda.OutOfMemoryError as exc:  # recorded; the next phase still runs
                    entry["measure"].append({"micro_batch": micro, "error": f"out of memory: {exc}"})
                    torch.cuda.empty_cache()
                    continue
                finally:
                    report.save()
                print(f"  micro_batch {micro}: {_summary(entry['measure'][-1])}", flush=True)
            # the fixed window, then the windowed variant (configs/flux-mixgrpo.yaml's schedule at W + 4 steps)
            for key, windowed in (("train", False), ("train_windowed", True)):
                try:
                    entry[key] = train(
                        model,
                        args.train_steps,
                        args.train_batch,
                        args.group_size,
                        args.window,
                        args.seed,
                        budget_end,
                        windowed=windowed,
                    )
                except torch.cuda.OutOfMemoryError as exc:
                    entry[f"{key}_error"] = f"out of memory: {exc}"
                report.save()
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        done = all(
            len(m["train"]) == len(m.get("train_windowed", [])) == args.train_steps
            for m in report.data["models"].values()
        )
        report.data["status"] = "complete" if done else "budget spent"
    except Exception as exc:  # the partial report keeps what was measured, with the error
        report.data["status"] = f"error: {type(exc).__name__}: {exc}"
        raise
    finally:
        report.data["wall_s"] = time.perf_counter() - start
        report.save()
        print(f"{report.data['status']} in {report.data['wall_s']:.0f} s: {report.path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
