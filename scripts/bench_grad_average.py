"""Gradient averaging across data-parallel ranks: one all-reduce per tensor against flat buckets.

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no scripts/bench_grad_average.py

Parameter sets: the tiny-shapes backbone's trainable tensors, and 480 LoRA-shaped pairs (rank 16 on 3072-wide
projections, as a FLUX LoRA has). Interleaved repeats; rank 0 prints the median time of each method per set
and the ratio per-tensor / bucketed (> 1: buckets are faster).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from accelerate import Accelerator

from jagg_engine.backbones import build_backbone
from jagg_engine.train.trainer import average_gradients


def per_tensor(params: list[torch.Tensor], acc: Accelerator) -> None:
    for p in params:
        p.grad = acc.reduce(p.grad, reduction="mean")


def main(repeats: int = 15) -> None:
    acc = Accelerator(cpu=True)
    sets = {
        "tiny-shapes": [
            p.detach().clone().requires_grad_() for p in build_backbone("tiny-shapes").trainable_parameters()
        ],
        "lora-480x2": [
            torch.zeros(shape, requires_grad=True) for _ in range(480) for shape in ((16, 3072), (3072, 16))
        ],
    }
    for name, params in sets.items():
        times: dict[str, list[float]] = {"per-tensor": [], "bucketed": []}
        for _ in range(repeats):
            for method in times:  # interleaved
                for p in params:
                    p.grad = torch.randn_like(p)
                dist.barrier()
                t0 = time.perf_counter()
                if method == "per-tensor":
                    per_tensor(params, acc)
                else:
                    average_gradients(params, acc.num_processes)
                times[method].append(time.perf_counter() - t0)
        if acc.is_main_process:
            med = {m: statistics.median(v) for m, v in times.items()}
            numel = sum(p.numel() for p in params)
            print(
                f"{name}: {len(params)} tensors, {numel} values; median per-tensor {med['per-tensor'] * 1e3:.2f} ms,"
                f" bucketed {med['bucketed'] * 1e3:.2f} ms; ratio {med['per-tensor'] / med['bucketed']:.2f}"
            )


if __name__ == "__main__":
    main()
