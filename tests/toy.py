"""The quiet linear-toy run the fault tests train through `jagg train` (milliseconds a step, no evals, no
images, no probes, a checkpoint every step), the environment its subprocesses run in and `jagg` run as one:
one copy instead of one a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

TOY = (
    "backbone=linear-toy",
    "rewards={brightness: 1.0}",
    "prompts_per_step=2",
    "group_size=2",
    "sampling_steps=4",
    "sde_window_end=null",
    "window=2",
    "eval_every=0",
    "sample_every=0",
    "probe_every=0",
    "checkpoint_every=1",
    "lr=1e-2",
)


def toy(**changes: object) -> list[str]:
    """:data:`TOY` as `key=value` overrides, with ``changes`` in place of (or after) its own values."""
    items = dict(item.split("=", 1) for item in TOY)
    items.update({key: str(value) for key, value in changes.items()})
    return [f"{key}={value}" for key, value in items.items()]


def jagg(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m jagg_engine.cli ARGS` in :data:`ENV`, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )
