"""One trainer process: ``python -m jagg_engine.train.process`` (started by ``jagg train``, alone or under
``accelerate launch``) runs :func:`main` → :func:`train`.

:func:`train` takes the run's lock (one trainer per run), sets up logging (``train.log`` in the run folder;
the terminal gets one line per failure, the traceback goes to the file), meets the other ranks and hands them
the run (:func:`share_run`), builds the :class:`jagg_engine.train.trainer.Trainer`, turns SIGINT and SIGTERM
into a cooperative stop after the step, and records the run's final status: ``finished``, ``cancelled``, or
``failed`` with the one line of :func:`failure_message`. Exit codes: 0, 1 (the run failed), and
:data:`CLAIM_REFUSED_RC` when another trainer has the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jagg_engine.errors import DiskFullError, is_disk_full
from jagg_engine.store import ClaimError, RunLock, RunStore, open_store
from jagg_engine.train.config import ConfigError, TrainConfig
from jagg_engine.train.files import reserve_space
from jagg_engine.train.steps import TrainingError
from jagg_engine.train.trainer import Trainer

log = logging.getLogger("jagg.train")

CLAIM_REFUSED_RC = 3  # another trainer has the run: this process trained nothing and left its status alone
LOCKED_ENV = "JAGG_RUN_LOCKED"  # set by `jagg train` to the run folder whose lock it holds for its children


def failure_message(exc: BaseException, store: RunStore | None) -> str:
    """The one line stored as a failed run's error: ``disk full: <path>`` for a full disk, else the type and
    message of the exception."""
    if is_disk_full(exc):
        if isinstance(exc, DiskFullError):
            return str(exc)
        path = getattr(exc, "filename", None)
        if path is None and store is not None:
            path = store.path  # SQLite reports no file: the history database
        return f"disk full: {path}"
    return f"{type(exc).__name__}: {exc}"


FILE_ONLY = "jagg_file_only"  # a log record with this attribute set goes to train.log, never to the terminal


def _terminal_handler() -> logging.Handler:
    """stderr without the records marked :data:`FILE_ONLY` (a failure's traceback): the terminal gets one line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(lambda record: not getattr(record, FILE_ONLY, False))
    return handler


def _remove_root_handlers(which: Callable[[logging.Handler], bool]) -> None:
    """Remove and close the root logger's handlers that ``which`` picks. A close flushes what the handler still
    buffers, which fails where its disk is full: that text is lost, and nothing is raised."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if which(handler):
            root.removeHandler(handler)
            try:
                handler.close()
            except OSError:
                pass


def _drop_root_handlers() -> None:
    """Remove and close every root handler, e.g. an earlier in-process run's train.log, before a run sets up
    its own (``basicConfig(force=True)`` would raise a full disk's failed flush into the new run's start)."""
    _remove_root_handlers(lambda handler: True)


def _close_run_log(run_dir: Path) -> None:
    """Remove and close the handler of ``run_dir``'s train.log when an in-process run returns (the app's and
    the tests' in-process runs would otherwise hold the file open, its buffer unflushed, until the next run
    starts); the run's status is written already."""
    target = os.path.abspath(run_dir / "train.log")
    _remove_root_handlers(lambda h: isinstance(h, logging.FileHandler) and h.baseFilename == target)


def _setup_logging(run_dir: Path | None, main: bool) -> None:
    if not main:
        logging.basicConfig(level=logging.WARNING, handlers=[_terminal_handler()])
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    _drop_root_handlers()
    handlers = [logging.FileHandler(run_dir / "train.log"), _terminal_handler()]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", handlers=handlers, force=True
    )


def share_run(
    acc: Any,
    run: dict[str, Any] | None,
    resume: bool,
    machine_rank: int,
    runs_dir: str,
    expect: dict[str, Any],
    from_scratch: bool = False,
) -> tuple[TrainConfig, int, bool, bool, Path]:
    """Global rank 0 holds the run (read from the store on machine 0); every rank receives its id, config,
    folder, resume and from-scratch flags after the rendezvous: machines other than 0 have no store to read them from.

    Each rank validates the config on its machine (prompt files, reward dependencies) and checks what its
    machine was given (``expect``: the CONFIG and run id of its ``jagg train``) against machine 0's. Any problem
    fails EVERY rank with the same line, so no rank is left waiting in a collective. Ranks on other machines
    keep their files (FSDP optimizer shards) in a folder of the same name under their own ``runs_dir``.
    """
    from accelerate.utils import broadcast_object_list, gather_object

    box: list[Any] = [None]
    if acc.is_main_process:
        box = [
            {
                "id": run["id"],
                "config": run["config"],
                "run_dir": run["run_dir"],
                "resume": resume,
                "from_scratch": from_scratch,
            }
        ]
    if acc.num_processes > 1:
        broadcast_object_list(box, from_process=0)
    shared = box[0]
    problem, cfg = None, None
    try:
        cfg = TrainConfig.from_dict(shared["config"]).validate()
        if "config" in expect:
            mine = TrainConfig.from_dict(expect["config"]).to_dict()
            differ = [k for k, v in cfg.to_dict().items() if mine.get(k) != v]
            if differ:
                problem = f"config: differs from machine 0's in {', '.join(differ)}"
        if expect.get("run_id") not in (None, shared["id"]):
            problem = (
                f"run id: machine 0 trains run {shared['id']}, this machine was given {expect['run_id']}"
            )
    except ConfigError as exc:
        problem = str(exc)
    reports = gather_object([(machine_rank, problem)]) if acc.num_processes > 1 else [(machine_rank, problem)]
    for rank, (machine, text) in enumerate(reports):
        if text:
            raise TrainingError(f"machine {machine} (rank {rank}): {text}")
    run_dir = Path(shared["run_dir"])
    if machine_rank != 0:
        run_dir = Path(runs_dir) / run_dir.name
    return cfg, int(shared["id"]), bool(shared["resume"]), bool(shared.get("from_scratch")), run_dir


def _mark_started() -> None:
    """Tell `jagg train` that the processes met (the launcher holds back the rendezvous output until then)."""
    marker = os.environ.get("JAGG_STARTED_FILE")
    if marker:
        Path(marker).touch()


def train(
    run_id: int | None,
    runs_dir: str,
    resume: bool = False,
    machine_rank: int = 0,
    from_scratch: bool = False,
) -> int:
    """Train run ``run_id`` of the store in ``runs_dir`` (its config is read from the store). Exit code.
    ``from_scratch`` (with ``resume``): start the run over from step 0 (:meth:`Trainer.start_over`).

    Global rank 0 reads the run; the other ranks (``run_id`` None on machines other than 0) receive it.
    """
    main = int(os.environ.get("RANK", "0")) == 0
    store = open_store(runs_dir) if main else None
    run = store.get_run(run_id) if main else None
    if main and run is None:
        log.error("run id: no run %s in %s", run_id, runs_dir)
        return 1
    lock = None
    if main:  # one trainer per run: the folder's lock, unless `jagg train` holds it for this process tree
        folder = Path(run["run_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        if os.environ.get(LOCKED_ENV) != str(folder.resolve()):
            try:
                lock = RunLock.acquire(folder, f"run {run_id}")
            except ClaimError as exc:
                print(f"jagg train: refused: {exc}", file=sys.stderr)
                return CLAIM_REFUSED_RC
    try:
        return _train_locked(run_id, runs_dir, resume, machine_rank, main, store, run, from_scratch)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(
    run_id: int | None,
    runs_dir: str,
    resume: bool,
    machine_rank: int,
    main: bool,
    store: RunStore | None,
    run: dict[str, Any] | None,
    from_scratch: bool = False,
) -> int:
    _setup_logging(Path(run["run_dir"]) if main else None, main)
    expect = json.loads(os.environ.get("JAGG_EXPECT") or "{}")
    trainer = None
    reserve = None
    try:
        if main:
            reserve = reserve_space(Path(run["run_dir"]))
        from accelerate import Accelerator

        acc = Accelerator(cpu=not torch.cuda.is_available())
        _mark_started()
        cfg, run_id, resume, from_scratch, run_dir = share_run(
            acc, run, resume, machine_rank, runs_dir, expect, from_scratch
        )
        trainer = Trainer(
            cfg, run_id, runs_dir, resume=resume, accelerator=acc, run_dir=run_dir, from_scratch=from_scratch
        )
        # The app runs a compare pair side by side with the cores split between them (OMP_NUM_THREADS).
        log.info("torch CPU threads: %d", torch.get_num_threads())

        def on_signal(signum, frame):  # cooperative: finish the step, save, mark cancelled
            log.warning("signal %d: stopping after this step", signum)
            trainer.stop_signal = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        status = trainer.run()
        if main:
            reserve.unlink(missing_ok=True)  # room for the final status, whatever the disk holds now
            store.set_status(run_id, status)
            log.info("run %d %s", run_id, status)
        close_process_group(acc, together=True)
        return 0
    except ClaimError as exc:  # another trainer has the run: say so, and leave its status alone
        log.error("jagg train: refused: %s", exc)
        return CLAIM_REFUSED_RC
    except Exception as exc:  # the run fails, its history stays: rows already written are intact
        message = failure_message(exc, store)
        log.error("run %s failed: %s", run_id, message)
        log.error("%s", traceback.format_exc().rstrip(), extra={FILE_ONLY: True})  # train.log keeps it
        if main:
            if reserve is not None:
                reserve.unlink(missing_ok=True)  # room for the status below when the disk is full
            try:
                store.set_status(run_id, "failed", error=message)
            except Exception as again:  # never lose the real error to a second one: it is in the log
                log.error("run %s: could not record the failure in %s: %s", run_id, store.path, again)
        return 1
    finally:
        if reserve is not None:
            reserve.unlink(missing_ok=True)
        close_process_group(None, together=False)  # a failed rank: its own, at once (the others fail too)
        if main:
            _close_run_log(Path(run["run_dir"]))


def close_process_group(acc: Any, together: bool) -> None:
    """End this process's part of the process group (several processes): ``together`` waits at a barrier for
    every rank first (a finished run: rank 0 has written the status), then destroys the group, so that no
    rank's exit tears down a communicator another still uses (gloo's "Connection closed by peer" abort at
    exit). A no-op in one process or once destroyed."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    try:
        if together and acc is not None:
            acc.wait_for_everyone()
        torch.distributed.destroy_process_group()
    except Exception as exc:  # a peer already gone: nothing left to end cleanly
        log.warning("process group: %s", " ".join(str(exc).split())[:300])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GRPO trainer process (started by `jagg train`).")
    parser.add_argument("--run-id", type=int, default=None, help="the run (global rank 0 needs it)")
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--from-scratch", action="store_true", help="with --resume: start over from step 0")
    parser.add_argument("--machine-rank", type=int, default=0)
    args = parser.parse_args(argv)
    return train(args.run_id, args.runs_dir, args.resume, args.machine_rank, args.from_scratch)


if __name__ == "__main__":
    raise SystemExit(main())
