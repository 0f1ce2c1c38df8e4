"""Activation memory per sample of FLUX.1-dev and SD3.5-medium under gradient checkpointing, estimated on a CPU.

    python scripts/activation_estimate.py --out reports/gpu/activation-estimate.json   # ~3 minutes, 2 cores

The shipped GPU configs are sized with these figures (their headers show the arithmetic). For each model a
shallow copy at the published width (FLUX: 1 double + 1 single block; SD3.5: a dual-attention block, a plain
one and the last, context-pre-only one) is built as ``scripts/gpu_check.py`` builds it (LoRA on the attention
projections), without gradient checkpointing, in float32 at 512 px with the pipeline's text length. One
forward with grad of one sample runs under :class:`jagg_engine.bench.SavedActivationMeter`, and every saved
byte is charged to the block that was running (forward hooks), the rest to "base" (embedders, final layer); a kind's figure is per block.

With gradient checkpointing (non-reentrant, as diffusers does it) a block keeps only its inputs until the
backward, where it is recomputed with its full internals, one block at a time. So, per sample in bf16:

    activations ≈ ½·(base + max_block internals) + Σ_blocks inputs
    inputs of a block = rows × (image tokens + text tokens) × width × 2 bytes

(rows = 2 for SD3.5, whose config samples with classifier-free guidance: one call runs 2 rows per sample.)

(½: float32 measured, bf16 trained). An estimate, not a measurement on a GPU: autocast keeps some tensors in
float32, the allocator rounds and fragments, and attention kernels differ (the CPU's flash kernel saves the
output and log-sum-exp, as FlashAttention does on a GPU). ``scripts/gpu_check.py`` measures the real peaks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import SPECS, build_check_model, published_config  # noqa: E402

from jagg_engine.bench import SavedActivationMeter  # noqa: E402


class _Attributing(SavedActivationMeter):
    """A meter that also sums the bytes newly saved while each labelled block runs (``label``)."""

    def __init__(self, exclude: list[torch.Tensor]):
        super().__init__(exclude)
        self.label = "base"
        self.by_label: dict[str, int] = {}

    def _add(self, ptr: int, nbytes: int) -> None:
        if ptr not in self._live:
            self.by_label[self.label] = self.by_label.get(self.label, 0) + nbytes
        super()._add(ptr, nbytes)


def measure(name: str, resolution: int) -> dict[str, Any]:
    """Saved bytes per block kind and base, float32, one sample; see the module docstring."""
    if name == "flux-dev":  # 1 double + 2 single blocks
        model = build_check_model(name, depth=1, gradient_checkpointing=False, resolution=resolution)
        tf = model.transformer
        blocks = {"double": list(tf.transformer_blocks), "single": list(tf.single_transformer_blocks)}
        tokens = model.latent_shape[0]  # (N, 64) packed
    else:  # a dual-attention block, a plain one, the last (context-pre-only) one
        overrides = {"dual_attention_layers": (0,)}
        model = build_check_model(
            name, 3, gradient_checkpointing=False, resolution=resolution, overrides=overrides
        )
        tf = model.transformer
        blocks = {k: [tf.transformer_blocks[i]] for i, k in enumerate(("dual", "plain", "last"))}
        tokens = (model.latent_shape[1] // 2) * (model.latent_shape[2] // 2)  # 2×2 patches
    cond = model.encode_prompts(["a photo of a cat"])
    z = torch.randn(1, *model.latent_shape)
    meter = _Attributing([*model.parameters(), *model.buffers(), z, *cond.values()])
    for label, modules in blocks.items():
        for block in modules:
            block.register_forward_pre_hook(lambda m, a, label=label: setattr(meter, "label", label))
            block.register_forward_hook(lambda m, a, o: setattr(meter, "label", "base"))
    with meter:
        v = model(z, torch.full((1,), 0.7), cond)
    per_block = {k: meter.by_label.get(k, 0) // len(modules) for k, modules in blocks.items()}
    width = tf.config.num_attention_heads * tf.config.attention_head_dim
    del v
    return {
        "saved_bytes_fp32": {**per_block, "base": meter.by_label.get("base", 0)},
        "width": width,
        "image_tokens": tokens,
        "text_tokens": model.text_len,
    }


def estimate(name: str, m: dict[str, Any]) -> dict[str, Any]:
    """bf16 bytes per sample under gradient checkpointing at the published depth (module docstring)."""
    cfg = published_config(name)
    saved = m["saved_bytes_fp32"]
    rows = 2 if SPECS[name].cfg_scale > 1 else 1  # classifier-free guidance runs 2 rows per sample
    block_input = rows * (m["image_tokens"] + m["text_tokens"]) * m["width"] * 2
    if name == "flux-dev":
        n_blocks = cfg["num_layers"] + cfg["num_single_layers"]
        internals = max(saved["double"], saved["single"])
    else:
        n_blocks = cfg["num_layers"]
        internals = max(saved["dual"], saved["plain"], saved["last"])
    per_sample = 0.5 * (saved.get("base", 0) + internals) + n_blocks * block_input
    no_ckpt = 0.5 * saved.get("base", 0) + 0.5 * (
        cfg["num_layers"] * saved["double"] + cfg["num_single_layers"] * saved["single"]
        if name == "flux-dev"
        else len(cfg["dual_attention_layers"]) * saved["dual"]
        + (cfg["num_layers"] - len(cfg["dual_attention_layers"]) - 1) * saved["plain"]
        + saved["last"]
    )
    return {
        "block_input_bytes_bf16": block_input,
        "blocks": n_blocks,
        "per_sample_bytes_bf16_checkpointed": per_sample,
        "per_sample_bytes_bf16_no_checkpointing": no_ckpt,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the figures as JSON here (default: print only)")
    p.add_argument("--resolution", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {}
    for name in SPECS:
        m = measure(name, args.resolution)
        report[name] = {**m, **estimate(name, m), "resolution": args.resolution}
        print(name, json.dumps(report[name]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
