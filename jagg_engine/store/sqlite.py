"""SQLite connections of the run index that wait on a busy database (busy timeout, ``BEGIN IMMEDIATE`` with
backoff), so no user ever reads "database is locked"."""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from pathlib import Path

from .base import BUSY_TIMEOUT_S, StoreError

WRITE_WAIT_S = 4 * BUSY_TIMEOUT_S  # how long a write (or an open) waits on other processes in all


def is_busy(exc: BaseException) -> bool:
    """SQLite's SQLITE_BUSY or SQLITE_LOCKED ("database is locked"): another connection holds the lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text or "table is locked" in text


class BusyWait:
    """Backoff between tries of an operation SQLite refused as busy: 50 ms doubling to 1 s, for up to
    :data:`WRITE_WAIT_S` in all; past that one :class:`StoreError` line naming the file."""

    def __init__(self, path: Path):
        self.path = path
        self.deadline = time.monotonic() + WRITE_WAIT_S
        self.delay = 0.05

    def backoff(self) -> None:
        if time.monotonic() > self.deadline:
            raise StoreError(
                f"{self.path}: another process has held its write lock for over {WRITE_WAIT_S:.0f} s;"
                " nothing was written, try again"
            )
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, 1.0)


def begin_immediate(conn: sqlite3.Connection, path: Path) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``: each try waits up to :data:`BUSY_TIMEOUT_S` (the busy timeout) for
    another process's write to end, and a busy answer is tried again with backoff (:class:`BusyWait`)."""
    waited = BusyWait(path)
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            waited.backoff()


def _connect(path: Path) -> sqlite3.Connection:
    """A read-write connection that waits :data:`BUSY_TIMEOUT_S` on a busy database before answering."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection. ``mode=ro`` reads a WAL database when its -wal/-shm files exist (or can be
    made); when they cannot, ``immutable=1`` reads the file as it is (a cleanly closed database keeps
    nothing in a WAL file)."""
    if not path.is_file():
        raise StoreError(f"runs folder {path.parent} is read-only and holds no {path.name}")
    base = "file:" + urllib.parse.quote(str(path.resolve()))
    for query in ("?mode=ro", "?mode=ro&immutable=1"):
        conn = sqlite3.connect(base + query, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            conn.close()
    raise StoreError(f"{path}: cannot be opened, even read-only")
