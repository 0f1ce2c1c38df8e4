"""The trainer's memory metrics: resident set size on every device, peak CUDA memory of the step on a GPU."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from jagg_engine.train.trainer import memory_metrics


def _vm_rss_bytes() -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_rss_is_the_processes_resident_set_and_grows_with_a_touched_buffer():
    before = memory_metrics(torch.device("cpu"))
    assert set(before) == {"memory/rss_bytes"}  # no CUDA key on a CPU device
    assert before["memory/rss_bytes"] == pytest.approx(_vm_rss_bytes(), rel=0.05)
    # 64 MiB of fresh anonymous pages, every page written, so resident. (A torch tensor could reuse pages
    # the allocator already holds from earlier tests, and the RSS would not move.)
    size = 64 * 2**20
    with mmap.mmap(-1, size) as buffer:
        for offset in range(0, size, mmap.PAGESIZE):
            buffer[offset] = 1
        after = memory_metrics(torch.device("cpu"))["memory/rss_bytes"]
    assert after - before["memory/rss_bytes"] > 48 * 2**20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_cuda_memory_counts_the_steps_largest_allocation():
    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats(device)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    del block
    peak = memory_metrics(device)["memory/peak_cuda_bytes"]
    assert peak >= 256 * 2**20
