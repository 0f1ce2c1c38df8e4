"""`jagg train`: validate the config, create (or attach to) a run in the store, start the trainer.

    jagg train [CONFIG] [key=value ...] [--processes N] [--runs-dir DIR]   a new run
    jagg train --run-id ID [--runs-dir DIR]                              a queued run created by the app
    jagg train --resume ID [--runs-dir DIR]                              continue after the last checkpoint

One process runs the trainer here; N > 1 processes go through ``accelerate launch`` (gloo on CPU, NCCL on
GPUs). Nothing is written before the config validates: a bad field is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from jagg_engine.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (see configs/); omitted = the tiny-shapes defaults")
    p.add_argument("overrides", nargs="*", help="key=value overrides of config fields, e.g. steps=3 window=4")
    p.add_argument("--processes", type=int, default=None, help="training processes (default: the config's)")
    p.add_argument(
        "--runs-dir", default=None, help="runs root holding jagg.db (default: the config's output_dir)"
    )
    p.add_argument("--run-id", type=int, default=None, help="train a queued run that already exists")
    p.add_argument("--resume", type=int, default=None, metavar="RUN_ID", help="resume a failed/cancelled run")


def free_port() -> int:
    """A free TCP port on the loopback interface for the processes' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_argv(processes: int, run_id: int, runs_dir: str, resume: bool) -> list[str]:
    """The ``accelerate launch`` command line for ``processes`` trainer processes on this machine."""
    argv = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    if processes > 1:
        argv.append("--multi_gpu")  # also the multi-process switch on CPU (with ACCELERATE_USE_CPU)
    if processes > 1:
        argv += ["--main_process_port", str(free_port())]  # two runs at once must not share a port
    argv += ["-m", "jagg_engine.train.trainer", "--run-id", str(run_id), "--runs-dir", runs_dir]
    return argv + (["--resume"] if resume else [])


RUN_ID_MAX = 2**63 - 1  # SQLite's INTEGER


def run(args: argparse.Namespace) -> int:
    from jagg_engine.store import DB_NAME, open_store
    from jagg_engine.train.config import ConfigError, TrainConfig, check_runs_dir, load_config
    from jagg_engine.train.trainer import train

    if args.resume is not None and args.run_id is not None:
        raise UsageError("--resume and --run-id: give one of them")
    attach = args.resume if args.resume is not None else args.run_id
    flag = "--resume" if args.resume is not None else "--run-id"
    if attach is not None and not 1 <= attach <= RUN_ID_MAX:
        raise UsageError(f"{flag}: must be a run id from 1 to {RUN_ID_MAX}, got {attach}")
    if args.processes is not None and args.processes < 1:
        raise UsageError(f"--processes: must be an integer >= 1, got {args.processes}")
    if args.overrides and args.config and "=" in args.config:  # `jagg train steps=3` without a file
        args.overrides.insert(0, args.config)
        args.config = None
    elif args.config and "=" in args.config:
        args.overrides, args.config = [args.config, *args.overrides], None

    if attach is not None:
        runs_dir = args.runs_dir or "runs"
        if not (Path(runs_dir) / DB_NAME).is_file():  # opening the store would create an empty history
            raise UsageError(f"{flag}: no run history in {runs_dir} (no {DB_NAME}); give --runs-dir")
        store = open_store(runs_dir)
        store.check_liveness()
        run = store.get_run(attach)
        if run is None:
            raise UsageError(f"run id: no run {attach} in {runs_dir}")
        allowed = ("failed", "cancelled") if args.resume is not None else ("queued",)
        if run["status"] not in allowed:
            raise UsageError(f"run {attach}: status is {run['status']}; allowed: {', '.join(allowed)}")
        try:
            cfg = TrainConfig.from_dict(run["config"]).validate()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        run_id = attach
    else:
        try:  # --processes is one more override, validated with the rest (fsdp and batch checks need it)
            extra = [f"processes={args.processes}"] if args.processes is not None else []
            cfg = load_config(args.config, [*args.overrides, *extra])
            runs_dir = args.runs_dir or cfg.output_dir
            check_runs_dir(runs_dir, "--runs-dir" if args.runs_dir else "output_dir")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        store = open_store(runs_dir)
        run_id = store.create_run(cfg.name, cfg.to_dict(), None)
        run_dir = Path(runs_dir) / f"run-{run_id:04d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        store.set_run_dir(run_id, run_dir)
        print(f"run {run_id}: {run_dir}", file=sys.stderr)

    processes = args.processes or cfg.processes
    resume = args.resume is not None
    if processes == 1:
        return train(run_id, str(runs_dir), resume=resume)
    env = dict(os.environ)
    try:
        import torch

        if not torch.cuda.is_available():
            env["ACCELERATE_USE_CPU"] = "true"
    except ImportError:
        pass
    proc = subprocess.run(accelerate_argv(processes, run_id, str(runs_dir), resume), env=env)
    return proc.returncode
