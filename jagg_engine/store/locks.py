"""Who may write: the one-trainer lock of a run folder, the index lock of a runs root, and whether a
recorded process still lives.

- :class:`RunLock`: an exclusive ``fcntl.flock`` on a run folder, held by its one trainer for its whole life.
- :func:`index_shared` / :func:`index_exclusive`: the runs root's :data:`INDEX_LOCK`; every write
  transaction of ``jagg.db`` holds it shared, ``jagg reindex`` exclusively while it rebuilds the file.
- :func:`pid_alive` and :func:`check_liveness`: a queued or running run whose process is gone is marked
  failed, with the tail of its log.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import (
    BUSY_TIMEOUT_S,
    DB_NAME,
    INDEX_LOCK,
    LOG_NAME,
    REINDEX_WAIT_S,
    ClaimError,
    StoreError,
    file_tail,
    storage_refusal,
)


def _flock_waiting(fd: int, mode: int, wait_s: float, refusal: str) -> None:
    """Take ``fd``'s lock in ``mode`` (LOCK_SH or LOCK_EX), trying every 50 ms for up to ``wait_s`` seconds;
    StoreError ``refusal`` past that."""
    deadline = time.time() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.time() > deadline:
                raise StoreError(refusal) from None
            time.sleep(0.05)


def index_shared(fd: int, db: Path) -> None:
    """Take the index lock ``fd`` shared, waiting up to :data:`REINDEX_WAIT_S` for a reindex to end."""
    _flock_waiting(
        fd,
        fcntl.LOCK_SH,
        REINDEX_WAIT_S,
        f"{db}: `jagg reindex` has been rebuilding the index for over {REINDEX_WAIT_S:.0f} s; nothing was"
        " written, try again when it has finished",
    )


@contextlib.contextmanager
def index_exclusive(root: Path) -> Iterator[None]:
    """The runs root's index lock (:data:`INDEX_LOCK`), exclusively: no store writes while it is held (each
    write transaction holds it shared, for a moment)."""
    fd = os.open(root / INDEX_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _flock_waiting(
            fd,
            fcntl.LOCK_EX,
            BUSY_TIMEOUT_S,
            f"runs dir: {root / DB_NAME} is being written for over {BUSY_TIMEOUT_S:.0f} s; try again",
        )
        yield
    finally:
        os.close(fd)


def pid_alive(pid: int, recorded_at: float | None = None) -> bool:
    """Whether a process with this pid exists and is not a zombie.

    ``os.kill(pid, 0)``: ProcessLookupError → gone; PermissionError → exists (another user's process, so
    alive). A zombie (exited, not yet reaped by its parent, e.g. an app that has not called wait) counts as
    dead; it is detected from /proc on Linux. With ``recorded_at`` (when the pid was stored, epoch seconds) a
    process that started later than that is a different one reusing the number, so the recorded one is dead
    (Linux only: the start time comes from /proc; elsewhere a reused pid counts as alive).
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS) or it vanished just now; os.kill said it existed
    fields = stat.rsplit(")", 1)[-1].split()  # the command name in (...) may contain spaces
    if fields[0] in ("Z", "X"):
        return False
    if recorded_at is not None:
        started = _process_start_time(fields)
        if started is not None and started > recorded_at + PID_START_SLACK_S:
            return False
    return True


PID_START_SLACK_S = 2.0  # /proc's boot time has whole seconds; a process is recorded after it starts


def _process_start_time(fields: list[str]) -> float | None:
    """Epoch seconds at which the process of a /proc/PID/stat line (the fields after the name) started."""
    try:
        ticks = int(fields[19])  # field 22 of stat: starttime, clock ticks since boot
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def check_liveness(store: Any) -> list[int]:
    """Mark ``store``'s queued/running runs whose process is gone as failed, with the tail of
    run_dir/train.log (see :meth:`jagg_engine.store.RunStore.check_liveness`); returns the ids marked."""
    if store.read_only:
        return []
    with store._lock:
        rows = store.db.execute(
            "SELECT id, pid, pid_at, status, run_dir, uid FROM runs"
            " WHERE status IN ('queued', 'running') AND pid IS NOT NULL"
        ).fetchall()
    failed = []
    for run_id, pid, pid_at, status, run_dir, uid in rows:
        if pid_alive(pid, pid_at):
            continue
        run_dir = store._resolve_dir(run_dir, uid)
        error = f"process {pid} exited without reporting a final status"
        tail = file_tail(Path(run_dir) / LOG_NAME) if run_dir else ""
        if tail:
            error += f"; last lines of {LOG_NAME}:\n{tail}"
        try:
            with store._writing():
                cur = store.db.execute(
                    "UPDATE runs SET status = 'failed', finished_at = ?, error = ?"
                    " WHERE id = ? AND status = ? AND pid = ?",
                    [time.time(), error, run_id, status, pid],
                )
                if cur.rowcount:
                    store._write_run_file(run_id)
        except sqlite3.OperationalError as exc:
            if storage_refusal(exc):
                continue  # a full disk or a folder turned read-only: the next look marks it
            raise
        if cur.rowcount:
            failed.append(run_id)
    return failed


class RunLock:
    """An exclusive OS lock (``fcntl.flock``) on a run folder, held by the one trainer of that run for as long
    as it lives (the kernel drops it when the process dies, even by ``kill -9``). Taken without waiting: a
    second trainer gets :class:`ClaimError` naming the holder's pid (from ``<run_dir>/.trainer.pid``).
    Re-entrant within a process (the launcher and the trainer it runs in-process share it)."""

    PID_FILE = ".trainer.pid"
    _held: dict[str, RunLock] = {}
    _held_lock = threading.Lock()

    def __init__(self, folder: Path, fd: int):
        self.folder, self._fd, self._count = folder, fd, 1

    @classmethod
    def acquire(cls, folder: str | os.PathLike[str], what: str = "run") -> RunLock:
        folder = Path(folder).resolve()
        key = str(folder)
        with cls._held_lock:
            held = cls._held.get(key)
            if held is not None:
                held._count += 1
                return held
            fd = cls._take(folder)
            if fd is None:
                raise ClaimError(f"{what}: another trainer holds {folder}{cls.holder(folder)}; not started")
            try:
                (folder / cls.PID_FILE).write_text(f"{os.getpid()}\n")
            except OSError:
                pass  # a folder that takes no writes still locks; the pid only names the holder
            lock = cls(folder, fd)
            cls._held[key] = lock
            return lock

    @staticmethod
    def _take(folder: Path) -> int | None:
        """An fd of ``folder`` holding its exclusive lock, or None when another process holds it."""
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @classmethod
    def holder(cls, folder: Path) -> str:
        """`` (pid P)`` of the trainer that last took the lock of ``folder``, or ""."""
        try:
            return f" (pid {int((Path(folder) / cls.PID_FILE).read_text().strip())})"
        except (OSError, ValueError):
            return ""

    @classmethod
    @contextlib.contextmanager
    def exclusive(cls, folder: Path, refusal: str) -> Iterator[None]:
        """Hold the folder's lock for a moment (a delete), as no trainer: a trainer of this or another process
        holding it raises StoreError ``refusal`` (``{holder}``: the holder's pid); a trainer starting meanwhile
        is refused, and one starting after finds its run gone."""
        folder = Path(folder).resolve()
        fd = None if str(folder) in cls._held else cls._take(folder)
        if fd is None:
            raise StoreError(refusal.format(holder=cls.holder(folder)))
        try:
            yield
        finally:
            os.close(fd)

    @staticmethod
    def held_elsewhere(folder: str | os.PathLike[str]) -> bool:
        """Whether another process holds the lock of ``folder`` now (a probe: taken and dropped at once)."""
        folder = Path(folder).resolve()
        if str(folder) in RunLock._held:
            return False
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken here
        return False

    def release(self) -> None:
        with self._held_lock:
            self._count -= 1
            if self._count > 0:
                return
            self._held.pop(str(self.folder), None)
            os.close(self._fd)
