"""The race's folder: one race per folder (its lock), a driver that is gone, how far a race got."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jagg_engine.errors import UsageError
from jagg_engine.store import pid_alive

from .plan import LOCK_NAME, RACE_JSON

# ------------------------------------------------------------------------------------------------ the folder


def _read_plan(out: Path) -> dict[str, Any]:
    return json.loads((out / RACE_JSON).read_text(encoding="utf-8"))


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file of this writer beside ``path`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _lock_holder(fd: int) -> str:
    """The pid a driver wrote into the lock file it holds, once written (it takes the lock first, then
    writes: up to a second); "?" when it has not."""
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError, IndexError):
            return str(int(os.pread(fd, 32, 0).split()[0]))
        time.sleep(0.05)
    return "?"


def claim_out(out: Path, plan: Mapping[str, Any]) -> int:
    """Claim ``out`` for one race, atomically: take an exclusive ``fcntl.flock`` on ``out/.race.lock`` (never
    waiting), refuse a folder that holds a race already, and write ``plan`` as its ``race.json``, all while
    holding the lock. Returns the lock's file descriptor: the race holds it (and so the folder) until its
    process ends, whatever ends it; the kernel releases it then. A second race on the folder, started at the
    same instant or later, is one UsageError line."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UsageError(f"--out: {out}: cannot create {LOCK_NAME}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UsageError(
                    f"--out: {out}: cannot lock {LOCK_NAME} ({exc.strerror or exc}); a race needs a folder"
                    " that supports file locks, so that one race runs in it at a time"
                ) from None
            raise UsageError(
                f"--out: {out}: another jagg race runs in it (pid {_lock_holder(fd)}); not started"
            ) from None
        if (out / RACE_JSON).exists():
            raise UsageError(
                f"--out: {out} holds a race already ({RACE_JSON}); give a new folder, or --report-only"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
    except BaseException:
        os.close(fd)
        raise
    return fd


def driver_gone(out: Path) -> str | None:
    """A race that reads ``running`` but whose driver is gone (killed, its machine rebooted): mark its
    race.json ``interrupted`` and return the one line that says so; None for a race that is running (its
    driver holds the folder's lock), ended, or not there. The driver's lock is the test (a pid can be
    reused; a lock dies with its process); a race.json without a lock file (written before the lock
    existed) falls back to the driver's pid. A folder that cannot be written is told, not changed."""
    try:
        if _read_plan(out).get("status") != "running":
            return None
    except (OSError, ValueError, AttributeError):
        return None
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(out / LOCK_NAME, flags | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            break
        except OSError:
            continue
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None  # held: the driver is alive
        plan = _read_plan(out)  # again, under the lock
        driver = plan.get("driver") or {}
        if plan.get("status") != "running" or (fd is None and _pid_alive(driver)):
            return None
        plan["status"] = "interrupted"
        plan["interrupted"] = {
            "at_unix": time.time(),
            "why": f"its driver (pid {driver.get('pid', '?')}) is gone",
        }
        line = f"race {out}: interrupted: its driver (pid {driver.get('pid', '?')}) is gone"
        try:
            _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
        except OSError as exc:
            return f"{line} ({RACE_JSON} not updated: {exc.strerror or exc})"
        return line
    except (OSError, ValueError, AttributeError):
        return None
    finally:
        if fd is not None:
            os.close(fd)


def _pid_alive(driver: Mapping[str, Any]) -> bool:
    try:
        return pid_alive(int(driver["pid"]), driver.get("started_at"))
    except (KeyError, TypeError, ValueError):
        return False


def check_runs_folder(runs_dir: str | os.PathLike[str]) -> str | None:
    """For ``jagg runs``: when ``runs_dir`` is a race's ``DIR/runs`` and the race's driver is gone, mark the
    race interrupted (:func:`driver_gone`) and return its line."""
    folder = Path(runs_dir)
    if folder.name != "runs":  # `--runs-dir .` from inside it
        folder = folder.resolve()
    if folder.name != "runs" or not (folder.parent / RACE_JSON).is_file():
        return None
    return driver_gone(folder.parent)


def race_state(plan: Mapping[str, Any]) -> tuple[str, str | None]:
    """How far the race got (its runs' statuses read from the store): its status, and for a race that has
    not finished every planned run, the words that say so (``the race is interrupted (…): 1 of 4 planned
    runs finished``)."""
    planned = len(plan["variants"]) * len(plan["seeds"])
    finished = sum(1 for e in plan["runs"] if e.get("status") == "finished")
    status = plan.get("status", "running")
    if status == "finished" and finished == planned:
        return status, None
    why = {
        "running": "still running",
        "interrupted": "interrupted",
        "failed": "failed",
    }.get(status, status)
    if status == "interrupted" and plan.get("interrupted"):
        why += f" ({plan['interrupted']['why']})"
    return status, f"the race is {why}: {finished} of {planned} planned runs finished"
