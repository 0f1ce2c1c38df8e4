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


# A race as small as the trainer allows (tests/test_race*.py): one prompt group of two samples, four sampling
# steps, two trained; an eval of two prompts at one seed every step.
RACE_TINY = [
    "prompts_per_step=1",
    "group_size=2",
    "sampling_steps=4",
    "sde_window_end=2",
    "window=2",
    "eval_num_prompts=2",
    "eval_seeds=[0]",
    "eval_every=1",
    "sample_every=0",
    "checkpoint_every=0",
]


def a_trained_and_a_queued_run(root: Path, overrides: list[str]) -> Path:
    """In the runs folder ``root``: run 1 trained to its end in this process with the tiny-shapes defaults and
    ``overrides``; run 2 created with the same config, queued, never trained. Returns ``root``."""
    from jagg_engine.store import open_store
    from jagg_engine.train.config import load_config
    from jagg_engine.train.trainer import Trainer

    cfg = load_config(None, overrides)
    with open_store(root) as store:
        run_id = store.create_run(cfg.name, cfg.to_dict(), root / "run-0001")
        assert Trainer(cfg, run_id, str(root)).run() == "finished"
        store.create_run("never trained", cfg.to_dict(), root / "run-0002")
    return root
