"""SQLite connections of the run index that wait on a busy database (busy timeout, ``BEGIN IMMEDIATE`` with
backoff), so no user ever reads "database is locked"; and ``sqlite_utils``, imported without pandas.

sqlite_utils imports pandas whenever it is installed (gradio installs it), only to map ``pandas.Timestamp``
to TEXT when a pandas value is inserted, which the store never does. pandas is most of the store's import
time (about 0.45 s of 0.7 s on a 2-core CPU), paid by every ``jagg runs``, ``jagg export`` and trainer start.
So the first import of sqlite_utils, here, hides pandas while it runs; ``import pandas`` works as usual
afterwards, and a process that imported pandas (or sqlite_utils) before imports sqlite_utils as it is. (Another
thread importing pandas during that import would fail; the store is imported as a process starts, and the app
imports gradio, hence pandas, first.)
"""

from __future__ import annotations

import importlib
import sqlite3
import sys
import time
import urllib.parse
from pathlib import Path
from types import ModuleType

from .base import BUSY_TIMEOUT_S, StoreError


def _import_sqlite_utils_without_pandas() -> ModuleType:
    if "sqlite_utils" in sys.modules or "pandas" in sys.modules:
        return importlib.import_module("sqlite_utils")
    sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError meanwhile
    try:
        return importlib.import_module("sqlite_utils")
    finally:
        if "pandas" in sys.modules and sys.modules["pandas"] is None:
            del sys.modules["pandas"]


sqlite_utils = _import_sqlite_utils_without_pandas()
Database = sqlite_utils.Database

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
