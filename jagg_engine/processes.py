"""Processes of the engine's commands: a trainer's command line, the CPU threads runs started together
get, and a process group stopped (SIGTERM, then SIGKILL). Used by ``jagg race`` and by the app's run
manager and workers. No torch here: nothing is imported to count the cores or see a GPU.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL of an overdue run's process group


def train_resume_command(run_id: int, runs_dir: Path) -> list[str]:
    """The trainer's command line that resumes a failed or cancelled run after its last checkpoint."""
    return [
        sys.executable,
        "-m",
        "jagg_engine.cli",
        "train",
        "--resume",
        str(run_id),
        "--runs-dir",
        str(runs_dir),
    ]


def train_command(run_id: int, runs_dir: Path) -> list[str]:
    """The trainer's command line for a run the app created (the trainer reads the config from the DB)."""
    return [
        sys.executable,
        "-m",
        "jagg_engine.cli",
        "train",
        "--run-id",
        str(run_id),
        "--runs-dir",
        str(runs_dir),
    ]


SIDE_BY_SIDE, SEQUENTIAL = "side-by-side", "sequential"  # store.PAIR_MODES
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch reads the first at import for its CPU threads


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def gpu_present() -> bool:
    """An NVIDIA driver is present (checked without initialising CUDA: no torch here)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


@dataclass(frozen=True)
class PairPlan:
    """How a compare pair runs: ``mode`` side-by-side or sequential, the torch CPU ``threads`` of each training
    process when side by side (0: torch's default), and ``reason``, one clause saying why."""

    mode: str
    threads: int
    reason: str


def plan_pair(processes: int, cores: int, gpu: bool, runs: int = 2) -> PairPlan:
    """Side by side when the machine has room for both runs at once: a CPU machine (on a GPU the runs would
    fight for its memory and kernels) with at least one core per training process of each run; the cores are
    split evenly, so each process gets ``cores // (2 × processes)`` threads and neither run waits on the other.
    ``runs``: the same rule for that many runs at once (``jagg race`` starts its variants together)."""
    processes, runs = max(1, int(processes)), max(1, int(runs))
    if gpu:
        return PairPlan(SEQUENTIAL, 0, "a GPU machine: each run has the GPU to itself")
    if cores < runs * processes:
        count = "two" if runs == 2 else str(runs)
        return PairPlan(
            SEQUENTIAL, 0, f"{cores} CPU core(s): too few for {count} runs of {processes} process(es) at once"
        )
    threads = cores // (runs * processes)
    per = f"{threads} CPU thread{'s' if threads > 1 else ''}"
    return PairPlan(SIDE_BY_SIDE, threads, f"{per} each of the {cores} cores")


def kill_group(pid: int, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group led by ``pid`` (a session leader we started), then SIGKILL it after
    ``grace`` seconds if any member is left."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        if not group_alive(pid):
            return
        _reap_pid(pid)
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(100):
        _reap_pid(pid)
        if not group_alive(pid):
            return
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # fields after the command: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _reap_pid(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
