"""Real faults for the tests: a mount (a small tmpfs for a full disk, a read-only bind mount), a disk filled to
its last block. The ``mounts`` fixture (conftest.py) mounts through :func:`mount` and unmounts after the test."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest


def mount(*args: str) -> Path:
    """``mount ARGS`` (the last one the mount point, created if missing); the test is skipped where mounting
    is not permitted (not root, no CAP_SYS_ADMIN). Returns the mount point."""
    point = Path(args[-1])
    point.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mount is not permitted here: {proc.stderr.strip()}")
    return point


def fill_disk(folder: Path) -> None:
    """Write zeros to ``folder/filler`` until the filesystem has no block left."""
    with (folder / "filler").open("wb", buffering=0) as fh:
        for size in (1 << 20, 1 << 12, 1 << 9):
            try:
                while True:
                    fh.write(bytes(size))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
