"""A step's logged figures beside the update's own: memory (:func:`memory_metrics`), the update's metrics
summed or averaged over its mini-batches (:func:`update_metrics`), and the training time with evals left out
(:class:`TrainingClock`: ``time/train_elapsed``, ``time/unix``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from jagg_engine.jagg import UpdateResult


def memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's memory: resident set size (from /proc; the peak RSS where there is none) and, on a CUDA
    device, the peak allocated since the step's start (train_step resets it)."""
    try:
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource  # not on /proc: the peak RSS (kilobytes on Linux, bytes on macOS)

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss = peak if sys.platform == "darwin" else peak * 1024
    out = {"memory/rss_bytes": float(rss)}
    if device.type == "cuda":
        out["memory/peak_cuda_bytes"] = float(torch.cuda.max_memory_allocated(device))
    return out


def update_metrics(results: list[UpdateResult]) -> dict[str, float]:
    """One step's update metrics from its mini-batches: loss/ means, time/ and count/ sums."""
    rows = [r.metrics() for r in results]
    out = {
        k: float(sum(r[k] for r in rows))
        if k.startswith(("time/", "count/"))
        else float(np.mean([r[k] for r in rows]))
        for k in rows[0]
    }
    out["loss/kl"] = out["loss/kl_ref"]
    out["count/forward"] = out["count/forward_grad"] + out["count/forward_nograd"]
    out["count/optimizer_steps"] = float(len(results))
    if len(results) > 1:  # the off-policy mini-batches: where the ratio and the clip act
        later = rows[1:]
        out["loss/clipfrac_offpolicy"] = float(np.mean([r["loss/clipfrac"] for r in later]))
        out["loss/ratio_dev_offpolicy"] = float(np.mean([abs(r["loss/ratio_mean"] - 1) for r in later]))
    return out


class TrainingClock:
    """Wall time spent training, evals left out. It starts when the first step starts (after the model is built
    and the step-0 eval) from ``elapsed`` seconds (a resumed run's value at its checkpoint's step; NaN when that
    was never logged). :meth:`lap` counts everything since the last lap or :meth:`restart` (the step, and the
    previous step's logging and checkpoint); :meth:`restart` after an eval leaves the eval out."""

    def __init__(self, elapsed: float = 0.0):
        self.elapsed = elapsed
        self.mark = time.perf_counter()

    def lap(self) -> dict[str, float]:
        now = time.perf_counter()
        self.elapsed += now - self.mark
        self.mark = now
        return {"time/train_elapsed": self.elapsed, "time/unix": time.time()}

    def restart(self) -> None:
        self.mark = time.perf_counter()
