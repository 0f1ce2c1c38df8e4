"""GPU check of the update-phase cost model: `jagg bench` on a mid-size Flux transformer, bf16, no download.

    python scripts/gpu_bench.py --out "$OUT"            # one CUDA GPU, about 2–4 minutes
    python scripts/gpu_bench.py --out /tmp/gb --tiny   # CPU dry run of the script itself (seconds)

Runs the bench (exact, jagg, jagg-sequential, endpoint, paper-code; interleaved rounds, medians) for
W = 4 and W = 8 at jagg_frac = 1 and W = 4 at jagg_frac = 0.6 on the same seeded rollout batch, and writes
``bench_w{W}_f{F}.json`` (the `jagg bench --json` object) per case plus ``summary.json`` (GPU, versions,
wall time) into ``--out``. Each table is printed as it finishes, so a run cut short still leaves its results.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from jagg_engine.backbones.flux_core import FLUX_DEV_CONFIG, TINY_FLUX_CONFIG, BenchFlux
from jagg_engine.bench import bench_backbone, format_table

# ~270 M parameters: FLUX.1-dev's architecture with 4 double-stream + 8 single-stream blocks at width 1024
# (8 heads × 128), text width 1024, 64 latent channels as FLUX.1's packed tokens; a 32×32 token grid (a 512²
# image) and 128 text tokens.
MID_FLUX_CONFIG = dict(
    FLUX_DEV_CONFIG, num_layers=4, num_single_layers=8, num_attention_heads=8, joint_attention_dim=1024
)
MID_GRID, MID_TEXT_LEN = (32, 32), 128

CASES = ((4, 1.0), (8, 1.0), (4, 0.6))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-bench-out"), help="output folder")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16, help="sampling steps T, all trained")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="CPU dry run with the tiny-flux config")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.tiny:
        name, device, dtype = "tiny-flux", torch.device("cpu"), torch.float32
        torch.set_num_threads(1)
        model = BenchFlux(dtype=dtype, device=device, config=TINY_FLUX_CONFIG, grid=(8, 8), text_len=4)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_bench: no CUDA device (use --tiny for a CPU dry run)")
        name, device, dtype = "mid-flux", torch.device("cuda"), torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = True
        model = BenchFlux(
            dtype=dtype, device=device, config=MID_FLUX_CONFIG, grid=MID_GRID, text_len=MID_TEXT_LEN
        )
    summary = {
        "model": name,
        "config": TINY_FLUX_CONFIG if args.tiny else MID_FLUX_CONFIG,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cases": [],
    }
    for window, frac in CASES:
        report = bench_backbone(
            name,
            model,
            window=window,
            jagg_frac=frac,
            batch=args.batch,
            steps=args.steps,
            repeats=args.repeats,
        )  # the same seeded rollout batch in every case
        path = out / f"bench_w{window}_f{frac:g}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        summary["cases"].append(path.name)
        print(format_table(report), flush=True)
    summary["wall_s"] = time.perf_counter() - start
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
