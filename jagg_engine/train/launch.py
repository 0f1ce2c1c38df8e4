"""`jagg train`: validate the config, create (or attach to) a run in the store, start the trainer.

    jagg train [CONFIG] [key=value ...] [--processes N] [--runs-dir DIR]   a new run
    jagg train --run-id ID [--runs-dir DIR]                              a queued run created by the app
    jagg train --resume ID [--runs-dir DIR]                              continue after the last checkpoint
    jagg train --resume ID --from-scratch [--runs-dir DIR]               start the run over from step 0

One process runs the trainer here; N > 1 processes go through ``accelerate launch`` (gloo on CPU, NCCL on
GPUs). Nothing is written before the config validates: a bad field is one line and exit code 2.

One trainer per run: on machine 0 this command takes the run folder's lock (:class:`jagg_engine.store.RunLock`)
before anything trains and holds it until its trainer processes end; a second ``--resume`` or ``--run-id`` of
the same run is refused in one line (exit code 2) and never touches the run's status. A new run gets a new
folder (:meth:`RunStore.create_run_folder`).

Several machines: the same command runs on each, with ``--machines M --machine-rank R --main-address
HOST:PORT`` or ``--accelerate-config FILE`` (accelerate's own config file, passed through). ``--processes``
counts the processes of ALL machines (accelerate's ``--num_processes``). Only machine 0 opens the runs
database and creates (or attaches to) the run; the trainer processes of the other machines receive the run id,
its config and the resume flag from global rank 0 after the rendezvous, and check their own CONFIG and flags
against it. The machines meet at HOST:PORT within ``--join-timeout`` seconds, or the command ends with exit
code 1 and one line naming the address (the run, on machine 0, reads failed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jagg_engine.errors import UsageError

JOIN_TIMEOUT_S = 300
# What torch's elastic agent prints when the machines did not meet at the rendezvous address in time.
_RENDEZVOUS_FAILURES = ("timed out", "DistStoreError", "DistNetworkError", "clients joined")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (see configs/); omitted = the tiny-shapes defaults")
    p.add_argument("overrides", nargs="*", help="key=value overrides of config fields, e.g. steps=3 window=4")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="training processes of all machines (default: the config's)",
    )
    p.add_argument(
        "--runs-dir", default=None, help="runs root holding jagg.db (default: the config's output_dir)"
    )
    p.add_argument("--run-id", type=int, default=None, help="train a queued run that already exists")
    p.add_argument("--resume", type=int, default=None, metavar="RUN_ID", help="resume a failed/cancelled run")
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="with --resume: start the run over from step 0 in the same run (its logged steps and checkpoints"
        " are discarded), e.g. when no checkpoint of it is intact",
    )
    scale = p.add_argument_group("several machines (accelerate launch)")
    scale.add_argument(
        "--machines", type=int, default=None, metavar="M", help="machines of the run (default 1)"
    )
    scale.add_argument(
        "--machine-rank", type=int, default=None, metavar="R", help="this machine's rank, 0..M-1 (default 0)"
    )
    scale.add_argument(
        "--main-address",
        default=None,
        metavar="HOST:PORT",
        help="machine 0's address, where the machines meet",
    )
    scale.add_argument(
        "--accelerate-config",
        default=None,
        metavar="FILE",
        help="an `accelerate config` file (num_processes, num_machines, machine_rank, main_process_ip/port)"
        " instead of --processes/--machines/--machine-rank/--main-address",
    )
    scale.add_argument(
        "--join-timeout",
        type=float,
        default=JOIN_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long the machines wait for each other at the main address (default {JOIN_TIMEOUT_S})",
    )


@dataclass(frozen=True)
class Topology:
    """Where this `jagg train` sits: ``processes`` counts all machines' processes (accelerate's meaning)."""

    processes: int
    machines: int = 1
    machine_rank: int = 0
    host: str | None = None
    port: int | None = None
    config_file: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); a one-line UsageError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"main-address: must be HOST:PORT with a port in 1..65535, got {text!r}")
    return host.strip("[]"), int(port)


def topology(args: argparse.Namespace, config_processes: int | None) -> Topology:
    """The machines and processes from the flags, or from an accelerate config file; checked."""
    flags = [
        name
        for name, value in (
            ("--processes", args.processes),
            ("--machines", args.machines),
            ("--machine-rank", args.machine_rank),
            ("--main-address", args.main_address),
        )
        if value is not None
    ]
    if args.join_timeout <= 0:
        raise UsageError(f"join-timeout: must be a number of seconds > 0, got {args.join_timeout:g}")
    if args.accelerate_config is not None:
        if flags:
            raise UsageError(f"accelerate-config: the file sets the machines; drop {', '.join(flags)}")
        return _topology_from_accelerate_config(args.accelerate_config)
    machines = 1 if args.machines is None else args.machines
    rank = 0 if args.machine_rank is None else args.machine_rank
    processes = args.processes or config_processes
    if processes is None:
        raise UsageError(
            f"processes: machine {rank} cannot read the run's config; give --processes N or the same CONFIG"
            " as machine 0"
        )
    if machines < 1:
        raise UsageError(f"machines: must be an integer >= 1, got {machines}")
    if not 0 <= rank < machines:
        raise UsageError(f"machine-rank: must be in 0..{machines - 1} (--machines {machines}), got {rank}")
    if processes % machines:
        raise UsageError(f"processes: must be a multiple of --machines ({machines}), got {processes}")
    if machines == 1:
        if args.main_address is not None:
            raise UsageError("main-address: only used with --machines > 1")
        return Topology(processes)
    if args.main_address is None:
        raise UsageError(f"main-address: required with --machines {machines} (HOST:PORT of machine 0)")
    host, port = parse_address(args.main_address)
    return Topology(processes, machines, rank, host, port)


def _topology_from_accelerate_config(path: str) -> Topology:
    from jagg_engine import safe_yaml

    try:
        data = safe_yaml.load_file(path, "accelerate-config") or {}
    except safe_yaml.YamlRefused as exc:
        raise UsageError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"accelerate-config: cannot read {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise UsageError(f"accelerate-config: {path} is not a mapping of accelerate settings")
    try:
        processes = int(data.get("num_processes") or 1)
        machines = int(data.get("num_machines") or 1)
        rank = int(data.get("machine_rank") or 0)
        port = data.get("main_process_port")
        port = None if port is None else int(port)
    except (TypeError, ValueError):
        raise UsageError(
            f"accelerate-config: num_processes, num_machines, machine_rank, main_process_port in {path}"
            " must be integers"
        ) from None
    if machines < 1 or not 0 <= rank < machines or processes % machines:
        raise UsageError(
            f"accelerate-config: {path} needs num_machines >= 1, machine_rank in 0..num_machines-1 and"
            f" num_processes a multiple of num_machines; got {processes}, {machines}, {rank}"
        )
    host = data.get("main_process_ip")
    if machines > 1 and (not host or port is None):
        raise UsageError(
            f"accelerate-config: {path} needs main_process_ip and main_process_port for {machines} machines"
        )
    return Topology(processes, machines, rank, host, port, config_file=str(path))


def free_port() -> int:
    """A free TCP port on the loopback interface for the processes' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_argv(
    processes: int,
    run_id: int | None,
    runs_dir: str,
    resume: bool,
    topo: Topology | None = None,
    join_timeout: float = JOIN_TIMEOUT_S,
    from_scratch: bool = False,
) -> list[str]:
    """The ``accelerate launch`` command line of this machine's trainer processes.

    One machine: ``--num_processes N --num_machines 1`` on a free loopback port. Several: accelerate's
    multi-node flags (``--num_machines --machine_rank --main_process_ip --main_process_port``), or the user's
    ``--config_file``; the static rendezvous of torch's elastic agent waits ``join_timeout`` seconds for the
    other machines (``--rdzv_conf timeout=…``). ``run_id`` is None on machines other than 0.
    """
    topo = topo or Topology(processes)
    argv = [sys.executable, "-m", "accelerate.commands.launch"]
    if topo.config_file is not None:
        argv += ["--config_file", topo.config_file]
    else:
        argv += ["--num_processes", str(processes), "--num_machines", str(topo.machines)]
        argv += ["--mixed_precision", "no", "--dynamo_backend", "no"]
        if processes > 1:
            argv.append("--multi_gpu")  # also the multi-process switch on CPU (with ACCELERATE_USE_CPU)
        if topo.machines > 1:
            argv += ["--machine_rank", str(topo.machine_rank), "--main_process_ip", str(topo.host)]
            argv += ["--main_process_port", str(topo.port)]
        elif processes > 1:
            argv += ["--main_process_port", str(free_port())]  # two runs at once must not share a port
    if topo.machines > 1:
        argv += ["--rdzv_conf", f"timeout={max(1, round(join_timeout))}"]
    argv += ["-m", "jagg_engine.train.process", "--runs-dir", runs_dir]
    argv += ["--machine-rank", str(topo.machine_rank)]
    if run_id is not None:
        argv += ["--run-id", str(run_id)]
    return argv + (["--resume"] if resume else []) + (["--from-scratch"] if resume and from_scratch else [])


RUN_ID_MAX = 2**63 - 1  # SQLite's INTEGER


def _processes_override(args: argparse.Namespace) -> list[str]:
    """``--processes`` (or the accelerate config file's num_processes) as one more ``key=value``, so the config
    is validated with the processes it runs with (fsdp, prompts_per_step and max_batch depend on them)."""
    if args.accelerate_config is not None:
        return [f"processes={_topology_from_accelerate_config(args.accelerate_config).processes}"]
    return [f"processes={args.processes}"] if args.processes is not None else []


def writable_store(runs_dir: str | os.PathLike[str]):
    """The store of ``runs_dir``, or a one-line UsageError when the folder cannot be written."""
    from jagg_engine.store import CorruptIndexError, StoreError, open_store

    try:
        store = open_store(runs_dir)
    except CorruptIndexError as exc:
        raise UsageError(str(exc)) from None
    except (StoreError, OSError) as exc:
        raise UsageError(f"runs dir: {runs_dir} cannot be opened for writing ({exc})") from None
    if store.read_only:
        raise UsageError(f"runs dir: {Path(runs_dir).resolve()} is read-only; nothing was written")
    return store


def run(args: argparse.Namespace) -> int:
    lock: list = []
    try:
        return _run(args, lock)
    finally:
        for held in lock:
            held.release()


def _run(args: argparse.Namespace, lock: list) -> int:
    from jagg_engine.store import (
        DB_NAME,
        RUN_FOLDER,
        ClaimError,
        RunLock,
        missing_index_message,
        run_folders_with_files,
    )
    from jagg_engine.train.config import ConfigError, TrainConfig, check_runs_dir, load_config
    from jagg_engine.train.process import CLAIM_REFUSED_RC, LOCKED_ENV, train

    if args.resume is not None and args.run_id is not None:
        raise UsageError("--resume and --run-id: give one of them")
    if getattr(args, "from_scratch", False) and args.resume is None:
        raise UsageError("--from-scratch: only with --resume RUN_ID (a new run starts from step 0 anyway)")
    attach = args.resume if args.resume is not None else args.run_id
    flag = "--resume" if args.resume is not None else "--run-id"
    if attach is not None and not 1 <= attach <= RUN_ID_MAX:
        raise UsageError(f"{flag}: must be a run id from 1 to {RUN_ID_MAX}, got {attach}")
    if args.processes is not None and args.processes < 1:
        raise UsageError(f"--processes: must be an integer >= 1, got {args.processes}")
    if args.runs_dir is not None and not args.runs_dir.isprintable():
        raise UsageError(
            f"--runs-dir: must be a folder path of printable characters (no newline, tab or control character),"
            f" got {args.runs_dir[:60]!r}"
        )
    if args.overrides and args.config and "=" in args.config:  # `jagg train steps=3` without a file
        args.overrides.insert(0, args.config)
        args.config = None
    elif args.config and "=" in args.config:
        args.overrides, args.config = [args.config, *args.overrides], None
    given = args.config is not None or bool(args.overrides)
    machine_rank = args.machine_rank or 0
    if args.accelerate_config is not None and args.machine_rank is None:
        machine_rank = _topology_from_accelerate_config(args.accelerate_config).machine_rank

    cfg, run_id, store, expect = None, None, None, {}
    if machine_rank != 0:
        # No store here: the run id and config come from machine 0; what is given is checked against them.
        if given:
            try:
                cfg = load_config(args.config, [*args.overrides, *_processes_override(args)])
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
            expect["config"] = cfg.to_dict()
        if attach is not None:
            expect["run_id"] = attach
        runs_dir = args.runs_dir or (cfg.output_dir if cfg is not None else "runs")
    elif attach is not None:
        runs_dir = args.runs_dir or "runs"
        if not os.path.lexists(
            os.path.join(runs_dir, DB_NAME)
        ):  # opening the store would create an empty history
            if found := run_folders_with_files(Path(runs_dir)):  # the index is lost, its folders are here
                raise UsageError(missing_index_message(Path(runs_dir), found))
            raise UsageError(f"{flag}: no run history in {runs_dir} (no {DB_NAME}); give --runs-dir")
        store = writable_store(runs_dir)
        store.check_liveness()
        run = store.get_run(attach)
        if run is None:
            raise UsageError(f"run id: no run {attach} in {runs_dir}")
        allowed = ("failed", "cancelled") if args.resume is not None else ("queued",)
        if run["status"] not in allowed:
            raise UsageError(f"run {attach}: status is {run['status']}; allowed: {', '.join(allowed)}")
        if run["run_dir"]:
            folder, root = Path(run["run_dir"]), Path(runs_dir).resolve()
            if RUN_FOLDER.match(folder.name) and not folder.resolve().is_relative_to(root):
                raise UsageError(
                    f"run {attach}: its folder {folder} is not inside the runs folder {root} (a copied or moved"
                    f" runs folder without its run-NNNN folders?); nothing was written: rebuild the index from"
                    f" the folders here with `jagg reindex --runs-dir {root}`"
                )
            folder.mkdir(parents=True, exist_ok=True)
            try:  # one trainer per run: held until this command ends
                lock.append(RunLock.acquire(folder, f"run {attach}"))
            except ClaimError as exc:
                raise UsageError(str(exc)) from None
            run = store.get_run(attach)  # read again under the lock: the holder may have ended it meanwhile
            if run is None:  # deleted between the read and the lock: leave no trace of this command
                lock.pop().release()
                with contextlib.suppress(OSError):
                    (folder / RunLock.PID_FILE).unlink()
                    folder.rmdir()  # only when empty: a folder the delete kept stays as it was
                raise UsageError(f"run {attach}: deleted meanwhile; not started")
            if run["status"] not in allowed:
                raise UsageError(f"run {attach}: status is {run['status']}; allowed: {', '.join(allowed)}")
        try:
            cfg = TrainConfig.from_dict(run["config"]).validate()
        except ConfigError as exc:
            if args.resume is None:  # a queued run that cannot start: its reason is the run's error
                _mark_failed(store, attach, str(exc))
            raise UsageError(str(exc)) from None
        run_id = attach
    else:
        try:
            cfg = load_config(args.config, [*args.overrides, *_processes_override(args)])
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        runs_dir = args.runs_dir or cfg.output_dir

    topo = topology(args, cfg.processes if cfg is not None else None)
    if cfg is not None and topo.processes != cfg.processes:
        try:
            cfg = cfg.apply_overrides([f"processes={topo.processes}"]).validate()
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if "config" in expect:
            expect["config"] = cfg.to_dict()
    if machine_rank == 0 and attach is None:
        if not os.path.lexists(os.path.join(runs_dir, DB_NAME)):  # a new history: the folder must take one
            try:
                check_runs_dir(runs_dir, "--runs-dir" if args.runs_dir else "output_dir")
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
        store = writable_store(runs_dir)
        # launcher "cli" and this process's pid, in one insert: the app never starts a run created here
        # a new folder, never an existing one
        run_id, run_dir = store.create_run_folder(cfg.name, cfg.to_dict(), launcher="cli", pid=os.getpid())
        lock.append(RunLock.acquire(run_dir, f"run {run_id}"))
        print(f"run {run_id}: {run_dir}", file=sys.stderr)

    resume = args.resume is not None
    from_scratch = resume and getattr(args, "from_scratch", False)
    if topo.processes == 1 and topo.config_file is None:
        return train(run_id, str(runs_dir), resume=resume, from_scratch=from_scratch)
    env = dict(os.environ)
    try:
        import torch

        if not torch.cuda.is_available():
            env["ACCELERATE_USE_CPU"] = "true"
    except ImportError:
        pass
    if expect:
        env["JAGG_EXPECT"] = json.dumps(expect)
    if lock:
        env[LOCKED_ENV] = str(lock[0].folder)  # the trainer processes run under this command's lock
    argv = accelerate_argv(
        topo.processes, run_id, str(runs_dir), resume, topo, args.join_timeout, from_scratch=from_scratch
    )
    if topo.machines > 1:
        who = "machine 0: waiting" if topo.machine_rank == 0 else f"machine {topo.machine_rank}: joining"
        print(
            f"{who} at {topo.address} ({topo.machines} machines, {topo.processes} processes,"
            f" join timeout {args.join_timeout:g} s)",
            file=sys.stderr,
        )
    rc, output, started = launch(argv, env)
    if rc == 0:
        return 0
    message = None
    if not started:
        log_path = _keep_output(output, store, run_id)
        if topo.machines > 1 and any(s in output for s in _RENDEZVOUS_FAILURES):
            peers = "machine 0" if topo.machine_rank else "machine 1"
            peers = peers if topo.machine_rank or topo.machines == 2 else f"machines 1..{topo.machines - 1}"
            message = (
                f"main-address: {peers} did not meet machine {topo.machine_rank} at {topo.address}"
                f" within {args.join_timeout:g} s (launcher output: {log_path})"
            )
        else:
            sys.stderr.write(output)
            message = f"accelerate launch: exit code {rc} before the trainer started (output: {log_path})"
        print(f"jagg train: error: {message}", file=sys.stderr)
        rc = 1
    if store is not None and run_id is not None and rc != CLAIM_REFUSED_RC:
        _mark_failed(store, run_id, message or f"trainer processes ended with exit code {rc}")
    return rc


def launch(argv: list[str], env: dict[str, str]) -> tuple[int, str, bool]:
    """Run ``accelerate launch``; its stderr is held back until a trainer process has started (the marker
    file), then passed through live. Returns (exit code, held-back output, whether the trainer started).

    A launch that fails before any trainer process starts (the machines did not meet) thus ends with one
    line of ours instead of the elastic agent's traceback, which is kept in a file.
    """
    fd, marker = tempfile.mkstemp(prefix="jagg-started-")
    os.close(fd)
    os.unlink(marker)
    env = {**env, "JAGG_STARTED_FILE": marker}
    held = bytearray()
    live = False
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    interrupted = 0
    while True:
        try:
            chunk = os.read(proc.stderr.fileno(), 1 << 16)
        except KeyboardInterrupt:  # the trainer stops cooperatively on the same SIGINT: keep draining
            interrupted += 1
            if interrupted > 1:
                proc.kill()
                raise
            continue
        if not chunk:
            break
        if not live and os.path.exists(marker):
            live = True
            sys.stderr.buffer.write(bytes(held))
            held.clear()
        if live:
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
        else:
            held += chunk
    rc = proc.wait()
    started = live or os.path.exists(marker)
    if started and held:
        sys.stderr.buffer.write(bytes(held))
        held.clear()
    if os.path.exists(marker):
        os.unlink(marker)
    return rc, held.decode("utf-8", "replace"), started


def _keep_output(output: str, store, run_id: int | None) -> str:
    """Write the held-back launcher output where the user can read it: the run folder on machine 0."""
    folder = None
    if store is not None and run_id is not None:
        run = store.get_run(run_id)
        folder = Path(run["run_dir"]) if run and run["run_dir"] else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "launch.log"
    else:
        fd, name = tempfile.mkstemp(prefix="jagg-launch-", suffix=".log")
        os.close(fd)
        path = Path(name)
    path.write_text(output, encoding="utf-8")
    return str(path)


def _mark_failed(store, run_id: int, message: str) -> None:
    """A launch that ended badly leaves the run failed, whatever stage it stopped at."""
    run = store.get_run(run_id)
    if run is not None and run["status"] in ("queued", "running"):
        store.set_status(run_id, "failed", error=message)
