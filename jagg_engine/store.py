"""The run store: SQLite history of runs, per-step metrics, gradient-fidelity probes and sample images.

One database per runs root (``<runs_dir>/jagg.db``), opened in WAL mode with a busy timeout, so the trainer
(writer) and the app / ``jagg runs`` (readers) can use it at the same time. Tables are created once
(:meth:`RunStore.ensure_schema`, idempotent); every query is parameterized; every write is one short
transaction.

Only the main process of a run writes (rank 0 under accelerate). The store does not know about ranks: the
trainer must simply not call it on the other ranks.

Tables
------
runs     id, name, config (JSON of TrainConfig.to_dict()), status, pid, created_at, started_at, finished_at
         (Unix seconds), error, run_dir, cancel_requested (0/1), last_step, paired_run_id, launcher,
         pair_mode, uid (unique, 32 hex digits: the run's identity in its folder and its checkpoints)
metrics  (run_id, step, key) → value — long format, primary key (run_id, step, key): logging a step twice
         (a resumed run replaying steps after its last checkpoint) overwrites, never duplicates
latest   (run_id, key) → step, value: each key's value at its largest step, kept in the same transaction as
         metrics, so run lists and final rewards read O(runs) rows however long the history is
probes   (run_id, step, batch, group_index, method) → t_start, t_end, cosine, rel_error
samples  (run_id, path) → step, kind (train | eval), prompt, seed, reward; path is relative to run_dir

Metric keys are namespaced with "/" (cleanrl style):
    reward/mean, reward/std, reward/<name>/mean   training rollouts (weighted total, then each component)
    eval/reward/mean, eval/reward/<name>/mean     deterministic eval
    loss/policy, loss/approx_kl, loss/clipfrac, loss/kl
    grad/norm, lr
    time/sampling, time/reward, time/update_forward, time/update_backward, time/update, time/step (seconds)
    time/train_elapsed, time/unix, time/eval       training wall seconds from step 1 to the end of this step's
                                                   update, evals left out; the Unix time of that instant; an
                                                   eval's own seconds (steps with an eval)
    count/forward, count/backward                  transformer passes in the update phase
    memory/rss_bytes, memory/peak_cuda_bytes       the main process: resident set size; peak CUDA memory of the step
:data:`FINAL_REWARD_KEYS` is the order in which a run's "final reward" is looked up.

Status transitions (anything else raises :class:`StoreError`)::

    queued  → running | failed | cancelled
    running → finished | failed | cancelled
    failed, cancelled → running | queued      (resume)
    failed, cancelled → failed                (a resume that fails before it runs: the new error replaces
                                               the old one)
    finished → (nothing)

Launchers: ``runs.launcher`` says who will start a queued run: ``app`` (the app's queue starts it) or ``cli``
(``jagg train`` created it and starts it itself; the app never does). Rows written before the column existed
count as the app's when they are still queued without a process.

Pair modes: ``runs.pair_mode`` says how the app schedules the two runs of a compare pair (NULL: not a pair):
``side-by-side`` (both start together and share the CPU, its threads split between them) or ``sequential``
(one after the other).

The run folder stands on its own; ``jagg.db`` is an index of the folders. Each run folder holds
``run.json`` (the run's row: a unique ``uid`` beyond the integer id, its config, status, times, pid), rewritten
atomically in the same transaction as every change of that row, and ``history.jsonl``, an append-only log of
its metrics, probes, samples and truncations, appended in the same transaction as the rows (before the commit:
a failed append rolls the rows back). :func:`reindex` (``jagg reindex``) rebuilds a lost or corrupt ``jagg.db``
from the folders. A new run never takes an existing folder: its id is above every ``run-NNNN`` folder of the
root and its folder is made with an exclusive ``mkdir`` (:meth:`RunStore.create_run_folder`). The WAL is
checkpointed after every logged step, so deleting the ``-wal`` file can lose at most the step in flight.

Integrity: at open, ``PRAGMA quick_check``; a corrupt or unopenable ``jagg.db`` (a flipped header, a malformed
page, a directory in its place) raises :class:`CorruptIndexError`, one line naming the file and the way out.

One trainer per run: :meth:`RunStore.claim` moves a run to running only from the statuses its trainer expects
(a compare-and-set in one transaction), :meth:`RunStore.claim_launch` gives a queued run to one launcher,
and :class:`RunLock` (``fcntl.flock`` on the run folder) is held by the trainer for its whole life.

Read-only: on a folder it cannot write (a read-only mount, a full disk where the WAL files cannot be made),
:func:`open_store` opens the database read-only (``mode=ro``, else ``immutable=1``); reads work and every
write raises :class:`StoreError` in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import sqlite3
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import sqlite_utils

STATUSES = ("queued", "running", "finished", "failed", "cancelled")
ACTIVE_STATUSES = ("queued", "running")
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "queued": ("running", "failed", "cancelled"),
    "running": ("finished", "failed", "cancelled"),
    "failed": ("running", "queued", "failed"),
    "cancelled": ("running", "queued", "failed"),
    "finished": (),
}
SAMPLE_KINDS = ("train", "eval")
LAUNCHERS = ("app", "cli")
PAIR_MODES = ("side-by-side", "sequential")
FINAL_REWARD_KEYS = ("eval/reward/mean", "reward/mean")
DB_NAME = "jagg.db"
LOG_NAME = "train.log"
RUN_FILE = "run.json"  # the run's identity and row, in its folder
HISTORY_FILE = "history.jsonl"  # the run's append-only log of metrics, probes, samples and truncations
RUN_FOLDER = re.compile(r"^run-(\d{4,})$")
REINDEX_HINT = "rebuild it from the run folders with `jagg reindex --runs-dir {root}`"
INDEX_LOCK = ".jagg.db.lock"  # writers of jagg.db hold it shared for each transaction; reindex exclusively
REINDEX_WAIT_S = 300.0  # how long a write waits for a reindex to finish
BUSY_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 20


class StoreError(ValueError):
    """A request the store refuses (unknown run, forbidden status change); the message is one line."""


class CorruptIndexError(StoreError):
    """``jagg.db`` cannot be used (corrupt, not a database, a directory); one line naming the file and
    ``jagg reindex``."""


class ClaimError(StoreError):
    """Another trainer or launcher has this run; the refused one leaves the run's status alone."""


class RunStore:
    """All reads and writes of the run history. Safe to share between threads (one lock per store)."""

    def __init__(self, db_path: str | os.PathLike[str], read_only: bool | None = None):
        """Open (creating if needed) the database; ``read_only`` None = read-only only when the folder
        cannot be written (see "Read-only" above), True = always, False = never (a write-less folder raises)."""
        self.path = Path(db_path)
        self._lock = threading.RLock()
        self._asked = read_only
        self._depth = 0  # write transactions open now (no reopen inside one)
        self._ident: tuple[int, int] | None = None  # (device, inode) of the file this store has open
        self._index_fd: int | None = None
        self._open()

    def _open(self) -> None:
        """Connect to :attr:`path` (see :meth:`__init__`); also how a replaced index is reopened."""
        read_only = self._asked
        if self.path.exists() and not self.path.is_file():
            raise CorruptIndexError(self._corrupt("is not a file"))
        if (
            not self.path.exists()
            and self.path.name == DB_NAME
            and (found := run_folders_with_files(self.path.parent))
        ):
            raise CorruptIndexError(missing_index_message(self.path.parent, found))
        self.read_only = bool(read_only) or (read_only is None and _unwritable(self.path))
        if not self.read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.path.name == DB_NAME and self._index_fd is None:  # the index's own store: see reindex
                    self._index_fd = os.open(self.path.parent / INDEX_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                self._db = sqlite_utils.Database(conn)
                self._ident = _file_id(self.path)
                self._check_integrity()
                self._db.enable_wal()
                self._db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
                self.ensure_schema()
                self._relocate_run_dirs()
                return
            except sqlite3.DatabaseError as exc:
                if (
                    isinstance(exc, sqlite3.OperationalError)
                    and _storage_refusal(exc)
                    and self.path.is_file()
                ):
                    if read_only is False:
                        raise
                    self.read_only = True
                elif isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                    raise
                else:
                    raise CorruptIndexError(self._corrupt(_one_line(exc))) from None
            except OSError as exc:
                if read_only is False or not _storage_refusal(exc) or not self.path.is_file():
                    raise
                self.read_only = True
        try:
            self._db = sqlite_utils.Database(_connect_read_only(self.path))
            self._ident = _file_id(self.path)
            self._check_integrity()
        except sqlite3.DatabaseError as exc:
            raise CorruptIndexError(self._corrupt(_one_line(exc))) from None

    @property
    def db(self) -> sqlite_utils.Database:
        """The open index. When ``jagg reindex`` has replaced the file since it was opened (another inode at
        :attr:`path`), it is reopened first, outside any transaction: every holder of this store (the app's
        History, its queue, its launches) goes on in the new index."""
        if self._depth == 0 and self._ident is not None and not self._db.conn.in_transaction:
            now = _file_id(self.path)
            if now is not None and now != self._ident:
                with self._lock:
                    if self._depth == 0 and _file_id(self.path) != self._ident:
                        with contextlib.suppress(sqlite3.Error):
                            self._db.conn.close()
                        self._open()
        return self._db

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction, under the store's lock and a shared lock of the runs root's index
        (:data:`INDEX_LOCK`): ``jagg reindex`` holds it exclusively while it reads the folders and swaps the
        file, so a write waits for the new index and goes into it, never into the one being replaced."""
        with self._lock:
            outer = self._depth == 0
            if outer:
                self._share_index()
            try:
                conn = self.db.conn  # a replaced index is reopened here, before the transaction
                self._depth += 1
                try:
                    with conn:
                        yield
                finally:
                    self._depth -= 1
            finally:
                if outer and self._index_fd is not None:
                    fcntl.flock(self._index_fd, fcntl.LOCK_UN)

    def _share_index(self) -> None:
        if self._index_fd is None:
            return
        deadline = time.time() + REINDEX_WAIT_S
        while True:
            try:
                fcntl.flock(self._index_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.time() > deadline:
                    raise StoreError(
                        f"{self.path}: `jagg reindex` has been rebuilding the index for over"
                        f" {REINDEX_WAIT_S:.0f} s; nothing was written, try again when it has finished"
                    ) from None
                time.sleep(0.05)

    def _corrupt(self, why: str) -> str:
        return f"{self.path}: {why}; the run index is unusable: " + REINDEX_HINT.format(root=self.path.parent)

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` (SQLite's O(N) structural check); raises :class:`CorruptIndexError`."""
        rows = self.db.execute("PRAGMA quick_check(1)").fetchall()
        if not rows or rows[0][0] != "ok":
            raise CorruptIndexError(
                self._corrupt("quick_check: " + _one_line(rows[0][0] if rows else "no answer"))
            )

    @property
    def runs_root(self) -> Path:
        return self.path.parent

    def close(self) -> None:
        self._ident = None  # a closed store is not reopened
        self._db.conn.close()
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ schema
    def ensure_schema(self) -> None:
        """Create the tables and indexes if they do not exist; safe to call any number of times."""
        with self._writing():
            # Plain DDL for runs: AUTOINCREMENT so a deleted run's id (and so its folder name) is never reused,
            # and a CHECK on the status values.
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS runs ("
                " id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " name TEXT NOT NULL,"
                " config TEXT NOT NULL,"
                f" status TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ({', '.join(map(repr, STATUSES))})),"
                " pid INTEGER,"
                " pid_at REAL,"
                " created_at REAL NOT NULL,"
                " started_at REAL,"
                " finished_at REAL,"
                " error TEXT,"
                " run_dir TEXT,"
                " cancel_requested INTEGER NOT NULL DEFAULT 0,"
                " last_step INTEGER,"
                " paired_run_id INTEGER,"
                " launcher TEXT,"
                " pair_mode TEXT,"
                " uid TEXT)"
            )
            self.db["metrics"].create(
                {"run_id": int, "step": int, "key": str, "value": float},
                pk=("run_id", "step", "key"),
                not_null={"run_id", "step", "key"},  # value NULL = NaN (SQLite stores NaN as NULL)
                if_not_exists=True,
            )
            self.db["probes"].create(
                {
                    "run_id": int,
                    "step": int,
                    "batch": int,
                    "group_index": int,
                    "method": str,
                    "t_start": float,
                    "t_end": float,
                    "cosine": float,
                    "rel_error": float,
                },
                pk=("run_id", "step", "batch", "group_index", "method"),
                not_null={"run_id", "step", "batch", "group_index", "method"},
                if_not_exists=True,
            )
            self.db["samples"].create(
                {
                    "run_id": int,
                    "path": str,
                    "step": int,
                    "kind": str,
                    "prompt": str,
                    "seed": int,
                    "reward": float,
                },
                pk=("run_id", "path"),
                not_null={"run_id", "path", "step", "kind"},
                if_not_exists=True,
            )
            if "pid_at" not in self.db["runs"].columns_dict:  # a history written before pid_at existed
                self.db.execute("ALTER TABLE runs ADD COLUMN pid_at REAL")
            if "launcher" not in self.db["runs"].columns_dict:  # before launcher: the app started queued runs
                self.db.execute("ALTER TABLE runs ADD COLUMN launcher TEXT")
                self.db.execute("UPDATE runs SET launcher = 'app' WHERE status = 'queued' AND pid IS NULL")
            if (
                "pair_mode" not in self.db["runs"].columns_dict
            ):  # before pair_mode: pairs ran one after the other
                self.db.execute("ALTER TABLE runs ADD COLUMN pair_mode TEXT")
            if "uid" not in self.db["runs"].columns_dict:  # before uid: every run gets one now
                self.db.execute("ALTER TABLE runs ADD COLUMN uid TEXT")
            for (run_id,) in self.db.execute("SELECT id FROM runs WHERE uid IS NULL").fetchall():
                self.db.execute("UPDATE runs SET uid = ? WHERE id = ?", [new_uid(), run_id])
            self._ensure_latest()
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS runs_uid ON runs (uid)")
            self.db.execute("CREATE INDEX IF NOT EXISTS runs_status ON runs (status)")
            self.db.execute("CREATE INDEX IF NOT EXISTS samples_step ON samples (run_id, step)")

    def _ensure_latest(self) -> None:
        """The ``latest`` summary table; a history written before it existed is filled from metrics once."""
        fresh = "latest" not in self.db.table_names()
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS latest (run_id INTEGER NOT NULL, key TEXT NOT NULL, step INTEGER NOT NULL,"
            " value REAL, PRIMARY KEY (run_id, key))"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS latest_key ON latest (key)")
        if fresh:
            self._refill_latest(None)

    def _refill_latest(self, run_id: int | None) -> None:
        """Recompute ``latest`` from metrics for one run (or all): each key's row at its largest step. SQLite
        takes the bare columns of a MAX() aggregate from the row that holds the maximum."""
        where, args = ("WHERE run_id = ?", [run_id]) if run_id is not None else ("", [])
        self.db.execute(
            "INSERT INTO latest (run_id, key, step, value)"
            f" SELECT run_id, key, MAX(step), value FROM metrics {where} GROUP BY run_id, key"
            " ON CONFLICT (run_id, key) DO UPDATE SET step = excluded.step, value = excluded.value"
            " WHERE excluded.step >= latest.step",
            args,
        )

    # ------------------------------------------------------------------ runs
    def create_run(
        self,
        name: str,
        config: Mapping[str, Any],
        run_dir: str | os.PathLike[str] | None,
        paired_run_id: int | None = None,
        launcher: str | None = None,
        pid: int | None = None,
    ) -> int:
        """Insert a queued run and return its id. ``config`` is stored as JSON (TrainConfig.to_dict()),
        ``run_dir`` as an absolute path (the log tail, sample paths and folder deletion depend on it).
        ``launcher`` "app" puts it in the app's queue; "cli" (or None) means its creator starts it, with
        ``pid`` the creator's process, recorded in the same insert (never "queued, no pid")."""
        self._check_writable()
        if launcher is not None and launcher not in LAUNCHERS:
            raise StoreError(f"launcher: must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        if paired_run_id is not None:
            self._require(paired_run_id)
        now = time.time()
        with self._writing():
            self.db.execute("BEGIN IMMEDIATE")  # the id read and the insert in one write transaction
            cur = self.db.execute(
                "INSERT INTO runs (id, name, config, status, created_at, run_dir, cancel_requested, paired_run_id,"
                " launcher, pid, pid_at, uid) VALUES (?, ?, ?, 'queued', ?, ?, 0, ?, ?, ?, ?, ?)",
                [
                    self._next_id(),
                    name,
                    json.dumps(dict(config)),
                    now,
                    self._stored_dir(run_dir),
                    paired_run_id,
                    launcher,
                    pid,
                    now if pid is not None else None,
                    new_uid(),
                ],
            )
            self._write_run_file(int(cur.lastrowid))
        self.checkpoint_wal()
        return int(cur.lastrowid)

    def create_run_folder(
        self,
        name: str,
        config: Mapping[str, Any],
        paired_run_id: int | None = None,
        launcher: str | None = None,
        pid: int | None = None,
    ) -> tuple[int, Path]:
        """A new run in a NEW folder ``<runs root>/run-<id>``: the id is above every id the index knows and
        every ``run-NNNN`` folder of the root (an index that lost rows cannot hand out a taken number), and the
        folder is made with an exclusive mkdir in the insert's transaction (a folder made meanwhile by another
        index moves the id on). Writes its ``run.json``. Returns (id, folder)."""
        self._check_writable()
        if launcher is not None and launcher not in LAUNCHERS:
            raise StoreError(f"launcher: must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        if paired_run_id is not None:
            self._require(paired_run_id)
        root = self.runs_root.resolve()
        for _ in range(1000):
            now = time.time()
            try:
                with self._writing():
                    self.db.execute("BEGIN IMMEDIATE")
                    run_id = self._next_id()
                    folder = root / f"run-{run_id:04d}"
                    self.db.execute(
                        "INSERT INTO runs (id, name, config, status, created_at, run_dir, cancel_requested,"
                        " paired_run_id, launcher, pid, pid_at, uid)"
                        " VALUES (?, ?, ?, 'queued', ?, ?, 0, ?, ?, ?, ?, ?)",
                        [
                            run_id,
                            name,
                            json.dumps(dict(config)),
                            now,
                            folder.name,
                            paired_run_id,
                            launcher,
                            pid,
                            now if pid is not None else None,
                            new_uid(),
                        ],
                    )
                    folder.mkdir()  # exclusive: FileExistsError rolls the insert back
                    self._write_run_file(run_id)
                self.checkpoint_wal()
                return run_id, folder
            except FileExistsError:
                continue
        raise StoreError(f"runs folder {root}: no free run-NNNN folder name found")

    def _next_id(self) -> int:
        """The id of the next run: above every id the index ever gave (AUTOINCREMENT's sequence) and above
        every ``run-NNNN`` folder of the root (an index that lost rows cannot hand out a folder's number)."""
        (known,) = self.db.execute(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'runs'), 0),"
            " COALESCE((SELECT MAX(id) FROM runs), 0))"
        ).fetchone()
        return max(int(known), highest_folder_id(self.runs_root)) + 1

    def set_run_dir(self, run_id: int, run_dir: str | os.PathLike[str]) -> None:
        """Record the run folder (when it is named after the id, it is known only after create_run)."""
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.db.execute("UPDATE runs SET run_dir = ? WHERE id = ?", [self._stored_dir(run_dir), run_id])
            self._write_run_file(run_id)

    def set_paired(self, run_id: int, paired_run_id: int | None) -> None:
        self._check_writable()
        self._require(run_id)
        if paired_run_id is not None:
            self._require(paired_run_id)
        with self._writing():
            self.db.execute("UPDATE runs SET paired_run_id = ? WHERE id = ?", [paired_run_id, run_id])
            self._write_run_file(run_id)

    def set_pair_mode(self, run_id: int, mode: str | None) -> None:
        """How the app schedules ``run_id`` and its paired run (:data:`PAIR_MODES`; None: not a pair)."""
        self._check_writable()
        self._require(run_id)
        if mode is not None and mode not in PAIR_MODES:
            raise StoreError(f"pair_mode: must be one of {', '.join(PAIR_MODES)}, got {mode!r}")
        with self._writing():
            self.db.execute("UPDATE runs SET pair_mode = ? WHERE id = ?", [mode, run_id])
            self._write_run_file(run_id)

    def set_status(self, run_id: int, status: str, error: str | None = None, pid: int | None = None) -> None:
        """Move a run to ``status`` (see the transition table); sets times, pid, error and clears flags.

        → running: started_at is kept from the first start; finished_at, error and cancel_requested are
        cleared (a resume starts clean). → finished / failed / cancelled: finished_at = now, error stored.
        """
        self._check_writable()
        if status not in STATUSES:
            raise StoreError(f"status: must be one of {', '.join(STATUSES)}, got {status!r}")
        now = time.time()
        pid_at = now if pid is not None else None  # when this pid was recorded (tells a reused pid apart)
        with self._writing():
            current = self._status(run_id)
            if status not in TRANSITIONS[current]:
                allowed = ", ".join(TRANSITIONS[current]) or "nothing"
                raise StoreError(f"run {run_id}: cannot go from {current} to {status} (allowed: {allowed})")
            if status == "running":
                self.db.execute(
                    "UPDATE runs SET status = ?, started_at = COALESCE(started_at, ?), finished_at = NULL,"
                    " error = NULL, cancel_requested = 0, pid = COALESCE(?, pid), pid_at = COALESCE(?, pid_at)"
                    " WHERE id = ?",
                    [status, now, pid, pid_at, run_id],
                )
            elif status == "queued":
                self.db.execute(
                    "UPDATE runs SET status = ?, finished_at = NULL, error = NULL, cancel_requested = 0,"
                    " pid = ?, pid_at = ? WHERE id = ?",
                    [status, pid, pid_at, run_id],
                )
            else:
                self.db.execute(
                    "UPDATE runs SET status = ?, finished_at = ?, error = COALESCE(?, error),"
                    " pid = COALESCE(?, pid), pid_at = COALESCE(?, pid_at) WHERE id = ?",
                    [status, now, error, pid, pid_at, run_id],
                )
            self._write_run_file(run_id)
        self.checkpoint_wal()

    def claim(self, run_id: int, expected: Iterable[str], pid: int) -> None:
        """Mark the run running for the trainer ``pid`` only if its status is one of ``expected`` (what
        the trainer was started for: queued, or failed/cancelled for a resume): a compare-and-set in one
        transaction. Raises :class:`ClaimError` (the status untouched) when another trainer took it."""
        self._check_writable()
        expected = tuple(expected)
        marks = ", ".join("?" for _ in expected)
        now = time.time()
        with self._writing():
            cur = self.db.execute(
                "UPDATE runs SET status = 'running', started_at = COALESCE(started_at, ?), finished_at = NULL,"
                f" error = NULL, cancel_requested = 0, pid = ?, pid_at = ? WHERE id = ? AND status IN ({marks})",
                [now, pid, now, run_id, *expected],
            )
            if cur.rowcount != 1:
                status = self._status(run_id)
                raise ClaimError(
                    f"run {run_id}: is {status}, not {' or '.join(expected)}: another trainer has it; not started"
                )
            self._write_run_file(run_id)
        self.checkpoint_wal()

    def claim_launch(self, run_id: int, pid: int) -> bool:
        """Give a queued, never launched run (no pid) to the launcher ``pid``: a compare-and-set in one
        transaction. False when another launcher (an app on the same folder) got it first."""
        self._check_writable()
        with self._writing():
            cur = self.db.execute(
                "UPDATE runs SET pid = ?, pid_at = ? WHERE id = ? AND status = 'queued' AND pid IS NULL"
                " AND cancel_requested = 0",
                [pid, time.time(), run_id],
            )
            if cur.rowcount == 1:
                self._write_run_file(run_id, logged=False)
            return cur.rowcount == 1

    def replace_pid(self, run_id: int, old: int, new: int | None) -> bool:
        """Set the run's pid to ``new`` only while it is ``old`` (a launcher hands its claim to its child, or
        gives it back with None when the child could not start)."""
        self._check_writable()
        with self._writing():
            cur = self.db.execute(
                "UPDATE runs SET pid = ?, pid_at = ? WHERE id = ? AND pid = ?",
                [new, None if new is None else time.time(), run_id, old],
            )
            if cur.rowcount == 1:
                self._write_run_file(run_id, logged=False)
            return cur.rowcount == 1

    def set_pid(self, run_id: int, pid: int | None) -> None:
        """Record the process that runs (or will run) this run, e.g. right after the app spawns it."""
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.db.execute(
                "UPDATE runs SET pid = ?, pid_at = ? WHERE id = ?",
                [pid, time.time() if pid is not None else None, run_id],
            )
            self._write_run_file(run_id, logged=False)

    def set_times(
        self, run_id: int, created_at: float, started_at: float | None, finished_at: float | None
    ) -> None:
        """Set the run's recorded times (a history loaded from elsewhere keeps the times it was recorded at)."""
        self._require(run_id)
        with self._writing():
            self.db.execute(
                "UPDATE runs SET created_at = ?, started_at = ?, finished_at = ? WHERE id = ?",
                [created_at, started_at, finished_at, run_id],
            )
            if not self.read_only:
                self._write_run_file(run_id)

    def request_cancel(self, run_id: int) -> None:
        """Ask a run to stop; the trainer polls :meth:`cancel_requested` between steps."""
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.db.execute("UPDATE runs SET cancel_requested = 1 WHERE id = ?", [run_id])

    def cancel_requested(self, run_id: int) -> bool:
        with self._lock:
            row = self.db.execute("SELECT cancel_requested FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return bool(row[0])

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """The run's row with ``config`` decoded to a dict, or None."""
        with self._lock:
            rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        return self._decode_run(rows[0]) if rows else None

    def list_runs(self) -> list[dict[str, Any]]:
        """All runs, newest first, with ``config`` decoded and ``final_reward`` / ``final_reward_key`` added.

        Reads the runs and ``latest`` tables only (never metrics): its cost does not grow with the history."""
        with self._lock:
            runs = [self._decode_run(r) for r in self.db.query("SELECT * FROM runs ORDER BY id DESC")]
            finals = self._final_rewards()
        for run in runs:
            key, value = finals.get(run["id"], (None, None))
            run["final_reward_key"], run["final_reward"] = key, value
        return runs

    def last_values(self, run_id: int, keys: Iterable[str]) -> dict[str, tuple[int, float | None]]:
        """For each key that was logged: (step, value) at the largest step."""
        keys = list(keys)
        if not keys:
            return {}
        marks = ", ".join("?" for _ in keys)
        with self._lock:
            rows = self.db.execute(
                f"SELECT key, step, value FROM {self._latest()} WHERE run_id = ? AND key IN ({marks})",
                [run_id, *keys],
            ).fetchall()
        return {key: (step, value) for key, step, value in rows}

    def delete_run(self, run_id: int, delete_files: bool = False) -> bool:
        """Delete the run's rows; with ``delete_files`` also its folder, but only when that folder lies
        strictly inside this store's runs root (never the root itself, never through a symlink).
        Returns whether a folder was removed. Refused (one line, "cancel it first") while the run is queued or
        running with a live process, or a trainer holds the folder's lock (a resume that has not marked the run
        running yet); the delete holds that lock itself, so a trainer starting after finds its run gone."""
        self._check_writable()
        run = self.get_run(run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}")
        if (
            run["status"] in ACTIVE_STATUSES
            and run["pid"] is not None
            and pid_alive(run["pid"], run["pid_at"])
        ):
            raise StoreError(f"run {run_id}: is {run['status']} (pid {run['pid']}); cancel it first")
        folder = Path(run["run_dir"]) if run["run_dir"] else None
        held = (
            RunLock.exclusive(folder, f"run {run_id}: a trainer holds its folder{{holder}}; cancel it first")
            if folder is not None and folder.is_dir()
            else contextlib.nullcontext()
        )
        with held:  # no trainer takes the run while its rows and folder go
            with self._writing():
                self._write_run_file(
                    run_id, deleted=True
                )  # a folder kept on disk is not brought back by reindex
                for table in ("metrics", "latest", "probes", "samples"):
                    self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                self.db.execute("UPDATE runs SET paired_run_id = NULL WHERE paired_run_id = ?", [run_id])
                self.db.execute("DELETE FROM runs WHERE id = ?", [run_id])
            owned = self._owned_folder(run["run_dir"])
            if delete_files and owned is not None:
                shutil.rmtree(owned)
                return True
        return False

    # ------------------------------------------------------------------ per-step logging
    def log_step(self, run_id: int, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one step's metrics (key → number; tensors and numpy scalars are fine) in one transaction.

        Upsert on (run_id, step, key); also raises runs.last_step to ``step``. NaN is stored as NULL.
        """
        self._check_writable()
        rows = []
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise StoreError(f"metric keys must be non-empty strings, got {key!r}")
            number = float(value)
            rows.append((run_id, int(step), key, None if math.isnan(number) else number))
        with self._logging_transaction():
            self._status(run_id)
            self._append_history(
                run_id, {"kind": "metrics", "step": int(step), "values": {r[2]: r[3] for r in rows}}
            )
            self.db.conn.executemany(
                "INSERT INTO metrics (run_id, step, key, value) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, step, key) DO UPDATE SET value = excluded.value",
                rows,
            )
            self.db.conn.executemany(
                "INSERT INTO latest (run_id, step, key, value) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, key) DO UPDATE SET step = excluded.step, value = excluded.value"
                " WHERE excluded.step >= latest.step",
                rows,
            )
            self.db.execute(
                "UPDATE runs SET last_step = MAX(COALESCE(last_step, ?), ?) WHERE id = ?",
                [step, step, run_id],
            )
        self.checkpoint_wal()

    def checkpoint_wal(self) -> None:
        """Copy the WAL into the database file now (PASSIVE: never waits on readers), so the ``-wal`` file
        holds at most the steps since; ``journal_size_limit`` keeps the file itself small."""
        if self.read_only:
            return
        with self._lock:
            try:
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.OperationalError:
                pass  # busy: the next step's checkpoint copies both

    def log_probes(self, run_id: int, step: int, probes: Iterable[Mapping[str, Any]]) -> None:
        """Gradient-fidelity rows: each has group_index, t_start, t_end, cosine, rel_error and optionally
        batch (default 0) and method ("jagg" by default, "endpoint" for the ablation). Upsert."""
        self._check_writable()
        rows = [
            (
                run_id,
                int(step),
                int(p.get("batch", 0)),
                int(p["group_index"]),
                str(p.get("method", "jagg")),
                float(p["t_start"]),
                float(p["t_end"]),
                float(p["cosine"]),
                float(p["rel_error"]),
            )
            for p in probes
        ]
        with self._logging_transaction():
            self._status(run_id)
            self._append_history(
                run_id, {"kind": "probes", "step": int(step), "rows": [list(r[2:]) for r in rows]}
            )
            self.db.conn.executemany(
                "INSERT INTO probes (run_id, step, batch, group_index, method, t_start, t_end, cosine, rel_error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, step, batch, group_index, method) DO UPDATE SET t_start = excluded.t_start,"
                " t_end = excluded.t_end, cosine = excluded.cosine, rel_error = excluded.rel_error",
                rows,
            )

    def log_samples(self, run_id: int, step: int, samples: Iterable[Mapping[str, Any]]) -> None:
        """Sample images already written under run_dir: each has kind (train | eval), prompt, seed, reward
        and path (relative to run_dir). Upsert on (run_id, path)."""
        self._check_writable()
        rows = []
        for s in samples:
            if s["kind"] not in SAMPLE_KINDS:
                raise StoreError(f"sample kind: must be one of {', '.join(SAMPLE_KINDS)}, got {s['kind']!r}")
            path = str(s["path"])
            if Path(path).is_absolute() or ".." in Path(path).parts:
                raise StoreError(f"sample path: must be relative to the run folder, got {path!r}")
            seed = s.get("seed")
            reward = s.get("reward")
            rows.append(
                (
                    run_id,
                    path,
                    int(step),
                    s["kind"],
                    s.get("prompt"),
                    None if seed is None else int(seed),
                    None if reward is None else float(reward),
                )
            )
        with self._logging_transaction():
            self._status(run_id)
            self._append_history(
                run_id, {"kind": "samples", "step": int(step), "rows": [list(r[1:]) for r in rows]}
            )
            self.db.conn.executemany(
                "INSERT INTO samples (run_id, path, step, kind, prompt, seed, reward) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, path) DO UPDATE SET step = excluded.step, kind = excluded.kind,"
                " prompt = excluded.prompt, seed = excluded.seed, reward = excluded.reward",
                rows,
            )

    def truncate_after(self, run_id: int, step: int) -> None:
        """Forget metrics, probes and samples logged after ``step`` and set last_step to it (or lower).

        A resumed run calls this with its checkpoint's step, so rows of the steps it replays are written
        fresh and nothing logged after the checkpoint by the crashed process survives.
        """
        self._check_writable()
        with self._logging_transaction():
            self._status(run_id)
            self._append_history(run_id, {"kind": "truncate", "step": int(step)})
            for table in ("metrics", "latest", "probes", "samples"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step > ?", [run_id, step])
            self._refill_latest(run_id)  # keys whose latest row went: their value at the new last step
            self.db.execute(
                "UPDATE runs SET last_step = (SELECT MAX(step) FROM metrics WHERE run_id = ?) WHERE id = ?",
                [run_id, run_id],
            )

    # ------------------------------------------------------------------ reading
    def metrics_frame(self, run_id: int) -> pd.DataFrame:
        """Wide frame: one row per step (column ``step``, ascending), one column per metric key."""
        with self._lock:
            rows = self.db.execute(
                "SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step", [run_id]
            ).fetchall()
        if not rows:
            return pd.DataFrame({"step": pd.Series([], dtype="int64")})
        long = pd.DataFrame(rows, columns=["step", "key", "value"]).astype({"value": "float64"})
        wide = long.pivot(index="step", columns="key", values="value").sort_index()
        wide = wide.reindex(sorted(wide.columns), axis=1)
        wide.columns.name = None
        return wide.reset_index()

    def probes(self, run_id: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(
                self.db.query(
                    "SELECT * FROM probes WHERE run_id = ? ORDER BY step, batch, method, group_index",
                    [run_id],
                )
            )

    def samples(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM samples WHERE run_id = ?" + (" AND kind = ?" if kind else "")
        with self._lock:
            return list(self.db.query(sql + " ORDER BY step, path", [run_id, kind] if kind else [run_id]))

    def sample_count(self, run_id: int) -> tuple[int, int | None]:
        """(number of sample rows, largest step) of a run, through the (run_id, step) index."""
        with self._lock:
            count, last = self.db.execute(
                "SELECT COUNT(*), MAX(step) FROM samples WHERE run_id = ?", [run_id]
            ).fetchone()
        return int(count), last

    def export_run(self, run_id: int, out_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``run-<id>-<name>.csv`` (the wide metrics frame) and ``run-<id>-<name>.json`` (the run
        row with its config, every metric in long form, probes and samples). Returns (csv_path, json_path)."""
        run = self.get_run(run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"run-{run_id}-{_slug(run['name'])}"
        csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
        self.metrics_frame(run_id).to_csv(csv_path, index=False)
        with self._lock:
            metrics = list(
                self.db.query(
                    "SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step, key", [run_id]
                )
            )
        doc = {"run": run, "metrics": metrics, "probes": self.probes(run_id), "samples": self.samples(run_id)}
        json_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return csv_path, json_path

    # ------------------------------------------------------------------ liveness
    def check_liveness(self) -> list[int]:
        """Mark queued/running runs whose process is gone as failed, with the tail of run_dir/train.log.

        Only runs with a recorded pid are checked (a queued run without one has not been launched). The
        update is conditional on the status and pid read, so a run that finishes meanwhile keeps its
        status. Returns the ids marked failed. A store that cannot write (read-only, disk full) marks nothing
        and shows the runs as they are.
        """
        if self.read_only:
            return []
        with self._lock:
            rows = self.db.execute(
                "SELECT id, pid, pid_at, status, run_dir, uid FROM runs"
                " WHERE status IN ('queued', 'running') AND pid IS NOT NULL"
            ).fetchall()
        failed = []
        for run_id, pid, pid_at, status, run_dir, uid in rows:
            if pid_alive(pid, pid_at):
                continue
            run_dir = self._resolve_dir(run_dir, uid)
            error = f"process {pid} exited without reporting a final status"
            tail = file_tail(Path(run_dir) / LOG_NAME) if run_dir else ""
            if tail:
                error += f"; last lines of {LOG_NAME}:\n{tail}"
            try:
                with self._writing():
                    cur = self.db.execute(
                        "UPDATE runs SET status = 'failed', finished_at = ?, error = ?"
                        " WHERE id = ? AND status = ? AND pid = ?",
                        [time.time(), error, run_id, status, pid],
                    )
                    if cur.rowcount:
                        self._write_run_file(run_id)
            except sqlite3.OperationalError as exc:
                if _storage_refusal(exc):
                    continue  # a full disk or a folder turned read-only: the next look marks it
                raise
            if cur.rowcount:
                failed.append(run_id)
        return failed

    # ------------------------------------------------------------------ the run folder
    def _stored_dir(self, run_dir: str | os.PathLike[str] | None) -> str | None:
        """How ``runs.run_dir`` keeps a folder: relative to the runs root when it lies inside it (so a copied
        or moved runs folder finds its run folders in itself), else absolute."""
        if run_dir is None:
            return None
        folder = Path(run_dir)
        folder = (folder if folder.is_absolute() else Path.cwd() / folder).resolve()
        root = self.runs_root.resolve()
        if folder != root and folder.is_relative_to(root):
            return folder.relative_to(root).as_posix()
        return str(folder)

    def _resolve_dir(self, stored: str | None, uid: str | None) -> str | None:
        """The absolute folder of a ``runs.run_dir`` value: a relative one lies in this runs root. An absolute
        one outside the root, written by a version that kept absolute paths, is taken as the root's folder of
        the same ``run-NNNN`` name when that folder's ``run.json`` carries the run's uid (the runs folder was
        copied or moved): a copy never writes into its original."""
        if not stored:
            return None
        root = self.runs_root.resolve()
        folder = Path(stored)
        if not folder.is_absolute():
            return str(root / folder)
        if folder.is_relative_to(root) or not RUN_FOLDER.match(folder.name):
            return stored
        here = root / folder.name
        if uid and _folder_uid(here) == uid:
            return str(here)
        return stored

    def _relocate_run_dirs(self) -> None:
        """Rewrite absolute ``run_dir`` values (older versions, or a copied or moved runs folder) that
        :meth:`_resolve_dir` places in this root as relative ones; once per open of a writable store."""
        rows = self.db.execute(
            "SELECT id, run_dir, uid FROM runs WHERE run_dir IS NOT NULL AND run_dir LIKE '/%'"
        ).fetchall()
        moved = []
        for run_id, stored, uid in rows:
            relative = self._stored_dir(self._resolve_dir(stored, uid))
            if relative != stored and not Path(relative).is_absolute():
                moved.append((relative, run_id))
        if moved:
            with self._writing():
                self.db.conn.executemany("UPDATE runs SET run_dir = ? WHERE id = ?", moved)

    def _decode_run(self, row: dict[str, Any]) -> dict[str, Any]:
        run = dict(row)
        run["config"] = json.loads(run["config"]) if run.get("config") else {}
        run["cancel_requested"] = bool(run["cancel_requested"])
        run["run_dir"] = self._resolve_dir(run.get("run_dir"), run.get("uid"))
        return run

    def _folder_of(self, run_id: int) -> Path | None:
        row = self.db.execute("SELECT run_dir, uid FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None or not row[0]:
            return None
        folder = Path(self._resolve_dir(*row))
        return folder if folder.is_dir() else None

    def _write_run_file(self, run_id: int, deleted: bool = False, logged: bool = True) -> None:
        """Rewrite ``<run_dir>/run.json`` from the run's row; called inside the transaction that changed the
        row (so writers of the row write the file in commit order). A run without a folder yet: nothing.
        ``logged``: the row also goes into ``history.jsonl`` as a ``run`` record (its config, status, times),
        from which :func:`reindex` rebuilds a run whose ``run.json`` is unreadable; changes of the pid alone
        are not logged."""
        folder = self._folder_of(run_id)
        if folder is None:
            return
        row = dict(next(iter(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))))
        row["config"] = json.loads(row["config"])
        row.pop("run_dir", None)  # the folder is where the file is
        doc = {"format": RUN_FILE_FORMAT, **row, **({"deleted": True} if deleted else {})}
        if logged:
            self._append_history(run_id, {"kind": "run", "row": doc})
        tmp = folder / f".{RUN_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, folder / RUN_FILE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @contextlib.contextmanager
    def _logging_transaction(self) -> Iterator[None]:
        """One transaction of rows and their history record: a failed append rolls the rows back, and a
        failed commit (a full disk) cuts the record off the file again, so the folder and the index agree."""
        with self._lock:
            self._undo_append = None
            try:
                with self._writing():
                    yield
            except BaseException:
                if self._undo_append is not None:
                    with contextlib.suppress(OSError):
                        os.truncate(*self._undo_append)  # shrinking a file needs no space
                raise
            finally:
                self._undo_append = None

    def _append_history(self, run_id: int, record: dict[str, Any]) -> None:
        """Append one record to ``<run_dir>/history.jsonl`` (inside :meth:`_logging_transaction`), with the
        run's uid and a checksum (:func:`history_line`). NaN is written as null, as SQLite stores it; ±inf as
        JSON's Infinity."""
        folder = self._folder_of(run_id)
        if folder is None:
            return
        path = folder / HISTORY_FILE
        line = history_line({**record, "uid": self.uid(run_id)})
        size = path.stat().st_size if path.exists() else 0
        if size:  # a torn last line (a process killed mid-write) is ended first: a record starts a line
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    line = "\n" + line
        self._undo_append = (path, size)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)

    def uid(self, run_id: int) -> str:
        """The run's unique id (its checkpoints carry it)."""
        with self._lock:
            row = self.db.execute("SELECT uid FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return row[0]

    # ------------------------------------------------------------------ helpers
    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"runs folder {self.runs_root} is read-only: nothing was written")

    def _status(self, run_id: int) -> str:
        row = self.db.execute("SELECT status FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return row[0]

    def _require(self, run_id: int) -> None:
        with self._lock:
            self._status(run_id)

    def _latest(self) -> str:
        """Where each key's last value is read: the ``latest`` table, or — in a history written before it
        existed and opened read-only, where it cannot be filled — the same rows computed from metrics."""
        if (
            not self.read_only
            or self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'latest'"
            ).fetchone()
        ):
            return "latest"
        return "(SELECT run_id, key, MAX(step) AS step, value FROM metrics GROUP BY run_id, key)"

    def _final_rewards(self) -> dict[int, tuple[str, float | None]]:
        """run_id → (key, value at its last step) for the first of FINAL_REWARD_KEYS each run logged."""
        marks = ", ".join("?" for _ in FINAL_REWARD_KEYS)
        rows = self.db.execute(
            f"SELECT run_id, key, value FROM {self._latest()} WHERE key IN ({marks})", list(FINAL_REWARD_KEYS)
        ).fetchall()
        found: dict[int, dict[str, float | None]] = {}
        for run_id, key, value in rows:
            found.setdefault(run_id, {})[key] = value
        return {
            run_id: next((k, values[k]) for k in FINAL_REWARD_KEYS if k in values)
            for run_id, values in found.items()
        }

    def _owned_folder(self, run_dir: str | None) -> Path | None:
        """run_dir if it is a real folder strictly inside the runs root, else None."""
        if not run_dir:
            return None
        folder = Path(run_dir)
        if not folder.is_absolute():
            folder = Path.cwd() / folder
        if folder.is_symlink() or not folder.is_dir():
            return None
        root = self.runs_root.resolve()
        resolved = folder.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            return None
        return resolved


RUN_FILE_FORMAT = 1
WAL_SIZE_LIMIT = 1 << 20  # bytes the -wal file is truncated to after a checkpoint


def new_uid() -> str:
    return uuid.uuid4().hex


def _folder_uid(folder: Path) -> str | None:
    """The uid in ``folder/run.json`` (None when it has none or cannot be read)."""
    try:
        doc = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("uid") if isinstance(doc, dict) and isinstance(doc.get("uid"), str) else None


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def run_folders_with_files(root: Path) -> list[str]:
    """The ``run-NNNN`` folders of ``root`` that hold a ``run.json`` or ``history.jsonl`` (a run's own files)."""
    try:
        names = sorted(n for n in os.listdir(root) if RUN_FOLDER.match(n))
    except OSError:
        return []
    return [n for n in names if (root / n / RUN_FILE).exists() or (root / n / HISTORY_FILE).exists()]


def missing_index_message(root: Path, found: list[str]) -> str:
    """One line: ``jagg.db`` is gone but run folders are here, and the way to bring it back."""
    shown = ", ".join(found[:3]) + (", …" if len(found) > 3 else "")
    return (
        f"{root / DB_NAME}: missing, but {root} holds {len(found)} run folder(s) ({shown}); "
        + REINDEX_HINT.format(root=root)
    )


def highest_folder_id(root: Path) -> int:
    """The largest N of the ``run-NNNN`` entries of ``root`` (0 when there is none)."""
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    return max((int(m.group(1)) for n in names if (m := RUN_FOLDER.match(n))), default=0)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def open_store(runs_dir: str | os.PathLike[str], read_only: bool | None = None) -> RunStore:
    """The store of a runs root: ``<runs_dir>/jagg.db`` (read-only where the folder cannot be written)."""
    return RunStore(Path(runs_dir) / DB_NAME, read_only=read_only)


def _unwritable(db_path: Path) -> bool:
    """Whether the database (or the folder that would hold it) exists and cannot be written."""
    for path in (db_path, db_path.parent):
        if path.exists():
            return not os.access(path, os.W_OK)
    return False


def _storage_refusal(exc: BaseException) -> bool:
    """An error that means "this storage takes no writes now" (read-only, full, no permission)."""
    import errno

    if isinstance(exc, OSError):
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)
    text = str(exc).lower()
    return any(
        s in text for s in ("readonly", "read-only", "disk is full", "unable to open", "disk i/o error")
    )


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


def file_tail(path: str | os.PathLike[str], lines: int = LOG_TAIL_LINES, max_bytes: int = 16_384) -> str:
    """The last ``lines`` lines of a text file, read from its last ``max_bytes`` bytes ("" if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "run"


# ------------------------------------------------------------------------------------------------ one trainer


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


# ------------------------------------------------------------------------------------------------ reindex


@dataclass
class ReindexReport:
    """What :func:`reindex` did: runs brought back (id → metric rows), folders skipped with why, the history
    lines it skipped (run id → [(line number, why)]) and those it took without a checksum (run id → count,
    lines of an older version), runs rebuilt without their ``run.json`` (one line each), and where the
    previous index was kept (None when there was none)."""

    runs: dict[int, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    previous: Path | None = None
    lines: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    unverified: dict[int, int] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)

    def summary(self, shown: int = 5) -> list[str]:
        """One line per run with skipped or unverified history lines: the count and the first positions."""
        out = []
        for run_id in sorted(set(self.lines) | set(self.unverified)):
            parts = []
            if self.lines.get(run_id):
                skipped = self.lines[run_id]
                first = ", ".join(f"line {n} ({why})" for n, why in skipped[:shown])
                more = f", and {len(skipped) - shown} more" if len(skipped) > shown else ""
                parts.append(f"{len(skipped)} history line(s) skipped: {first}{more}")
            if self.unverified.get(run_id):
                parts.append(f"{self.unverified[run_id]} line(s) without a checksum (an older version) taken")
            out.append(f"run {run_id}: " + "; ".join(parts))
        return out


HISTORY_CRC = re.compile(r',"crc":"([0-9a-f]{16})"\}$')


def _crc(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def history_line(record: Mapping[str, Any]) -> str:
    """One line of ``history.jsonl``: the record as compact JSON, its last key ``crc`` the first 16 hex digits
    of the sha256 of the line before it (with the closing brace), so a flipped byte fails the check."""
    body = json.dumps(dict(record), separators=(",", ":"))
    return f'{body[:-1]},"crc":"{_crc(body)}"}}\n'


@dataclass
class History:
    """The records of a ``history.jsonl`` that prove themselves, the lines skipped [(line number, why)], and
    how many lines were taken without a checksum (an older version wrote none)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    unverified: int = 0


def read_history(path: Path, uid: str | None) -> History:
    """Parse ``history.jsonl``, skipping: a torn last line; a line that is not a JSON record; a line whose
    checksum fails (a flipped byte); a line of another run (its uid is not ``uid``; None: any uid, for a run
    whose ``run.json`` is lost); a line without a checksum after one with (pasted: an older version
    writes none, and a version that writes them never goes back); and a line with a run uid but no intact
    checksum (this version writes both: a flipped byte inside ``"crc"``)."""
    out = History()
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return out
    lines = text.split("\n")
    checked = False
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no end of line: the write of this line never finished
        match = HISTORY_CRC.search(raw)
        if match and _crc(raw[: match.start()] + "}") != match.group(1):
            out.skipped.append((number, "torn" if torn else "checksum does not match"))
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            out.skipped.append((number, "torn" if torn else "not a JSON record"))
            continue
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            out.skipped.append((number, "not a history record"))
            continue
        if match is None:
            if checked:
                out.skipped.append((number, "no checksum (pasted?)"))
                continue
            if record.get("uid") is not None:  # this version's line (it has a uid) with its checksum damaged
                out.skipped.append((number, "checksum missing or damaged"))
                continue
            out.unverified += 1
        checked = checked or match is not None
        if uid is not None and record.get("uid") not in (None, uid):
            out.skipped.append((number, f"of another run ({str(record.get('uid'))[:12]})"))
            continue
        if match is not None and not record.get("uid"):
            out.skipped.append((number, "no run uid"))
            continue
        record.pop("crc", None)
        out.records.append(record)
    return out


def read_run_folder(
    folder: Path, old_rows: Mapping[int, dict[str, Any]] | None = None
) -> tuple[dict[str, Any], History, str | None]:
    """A run folder's identity (``run.json``), its history (:func:`read_history`) and, when ``run.json`` was
    unreadable, one line saying where the run's row came from instead: the last ``run`` record of its
    history (config, status, times as logged), else ``old_rows`` (the previous index, by the folder's number).
    Raises StoreError when none of these gives the run an id and uid."""
    try:
        doc = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), int) or not doc.get("uid"):
            raise ValueError("no run id and uid")
    except (OSError, ValueError) as exc:
        why = f"{folder / RUN_FILE}: unreadable ({_one_line(exc)})"
        number = int(RUN_FOLDER.match(folder.name).group(1)) if RUN_FOLDER.match(folder.name) else None
        history = read_history(folder / HISTORY_FILE, None)
        logged = [
            r["row"]
            for r in history.records
            if r["kind"] == "run" and isinstance(r.get("row"), dict) and r["row"].get("id") == number
        ]
        if logged and logged[-1].get("uid"):
            doc = dict(logged[-1])
            mine = read_history(folder / HISTORY_FILE, doc["uid"])
            return doc, mine, f"{why}; rebuilt from its {HISTORY_FILE} (status {doc.get('status')})"
        old = (old_rows or {}).get(number)
        if old is not None and old.get("uid"):
            doc = {**old, "config": json.loads(old.get("config") or "{}")}
            mine = read_history(folder / HISTORY_FILE, doc["uid"])
            return doc, mine, f"{why}; its row kept from the previous index (status {doc.get('status')})"
        raise StoreError(
            f"{why}, and neither its {HISTORY_FILE} nor the previous index names the run"
        ) from None
    return doc, read_history(folder / HISTORY_FILE, doc["uid"]), None


def _old_index_rows(db: Path) -> dict[int, dict[str, Any]]:
    """The runs rows of the index being replaced, by id (empty when it cannot be read)."""
    if not db.is_file():
        return {}
    try:
        conn = sqlite3.connect("file:" + urllib.parse.quote(str(db.resolve())) + "?mode=ro", uri=True)
        try:
            conn.row_factory = sqlite3.Row
            return {int(r["id"]): dict(r) for r in conn.execute("SELECT * FROM runs")}
        finally:
            conn.close()
    except sqlite3.Error:
        return {}


@contextlib.contextmanager
def _index_exclusive(root: Path) -> Iterator[None]:
    """The runs root's index lock (:data:`INDEX_LOCK`), exclusively: no store writes while it is held (each
    write transaction holds it shared, for a moment)."""
    fd = os.open(root / INDEX_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.time() + BUSY_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    raise StoreError(
                        f"runs dir: {root / DB_NAME} is being written for over {BUSY_TIMEOUT_S:.0f} s; try again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def reindex(runs_dir: str | os.PathLike[str]) -> ReindexReport:
    """Rebuild ``<runs_dir>/jagg.db`` from the run folders (``run.json`` + ``history.jsonl``).

    Refused (StoreError) while a trainer holds a run folder: it writes to the index being replaced. The
    whole rebuild holds the index lock exclusively, so a store open beside it (the app) waits with its
    writes and then reopens the new file (:attr:`RunStore.db`): nothing written meanwhile is lost.

    Atomic: the new index is built beside the old one and renamed over it (``os.replace``); the old one is
    kept as ``jagg.db.before-reindex-<time>`` by a hard link made before, so a kill at any moment leaves the
    old index or the new one at ``jagg.db``, never none. (A directory or symlink in its place, which no
    store can open, is moved aside first.)"""
    root = Path(runs_dir).resolve()
    if not root.is_dir():
        raise StoreError(f"runs dir: {root} is not a folder")

    def folders() -> list[Path]:
        return sorted(
            (p for p in root.iterdir() if RUN_FOLDER.match(p.name) and p.is_dir() and not p.is_symlink()),
            key=lambda p: int(RUN_FOLDER.match(p.name).group(1)),
        )

    def refuse_busy(found: list[Path]) -> None:
        busy = [p.name for p in found if RunLock.held_elsewhere(p)]
        if busy:
            raise StoreError(f"runs dir: {', '.join(busy)} training now; stop it before `jagg reindex`")

    refuse_busy(folders())
    report = ReindexReport()
    db = root / DB_NAME
    with _index_exclusive(root):
        found = folders()  # again under the lock: a run created meanwhile is in
        refuse_busy(found)
        old_rows = _old_index_rows(db)
        building = root / f".{DB_NAME}.reindex"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        new = RunStore(building, read_only=False)
        seen: dict[str, Path] = {}
        try:
            for folder in found:
                try:
                    doc, history, rebuilt = read_run_folder(folder, old_rows)
                except StoreError as exc:
                    report.skipped.append(str(exc))
                    continue
                if doc.get("deleted"):
                    report.skipped.append(f"{folder}: run {doc['id']} was deleted from the history")
                    continue
                if doc["uid"] in seen or new.get_run(doc["id"]) is not None:
                    report.skipped.append(
                        f"{folder}: run {doc['id']} ({doc['uid']}) already indexed from {seen.get(doc['uid'])}"
                    )
                    continue
                seen[doc["uid"]] = folder
                if rebuilt:
                    report.rebuilt.append(f"run {doc['id']}: {rebuilt}")
                if history.skipped:
                    report.lines[doc["id"]] = history.skipped
                if history.unverified:
                    report.unverified[doc["id"]] = history.unverified
                report.runs[doc["id"]] = _index_folder(new, folder, doc, history.records)
            new.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            new.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        _swap_in(building, db, report)
    return report


def _swap_in(building: Path, db: Path, report: ReindexReport) -> None:
    """Put the built index at ``db``, keeping the old one as ``<db>.before-reindex-<time>`` (see reindex)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    previous = db.parent / f"{DB_NAME}.before-reindex-{stamp}"
    n = 1
    while any(os.path.lexists(f"{previous}{s}") for s in ("", "-wal", "-shm")):
        n += 1
        previous = db.parent / f"{DB_NAME}.before-reindex-{stamp}-{n}"
    if db.is_symlink() or (db.exists() and not db.is_file()):  # unopenable: nothing usable to keep in place
        report.previous = previous
        for suffix in ("", "-wal", "-shm"):
            if os.path.lexists(f"{db}{suffix}"):
                os.replace(f"{db}{suffix}", f"{previous}{suffix}")
    elif db.exists():
        report.previous = previous
        with contextlib.suppress(sqlite3.Error):  # the old WAL into the old file (a corrupt one: as it is)
            conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.close()
        for suffix in ("-wal", "-shm"):  # the old file's WAL goes with it; never left beside the new one
            if os.path.lexists(f"{db}{suffix}"):
                os.replace(f"{db}{suffix}", f"{previous}{suffix}")
        try:
            os.link(db, previous)  # the old index stays at db until the replace below
        except OSError:
            shutil.copy2(db, previous)
    os.replace(building, db)
    with contextlib.suppress(OSError):  # the renames on disk, in this order
        fd = os.open(db.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _index_folder(store: RunStore, folder: Path, doc: dict[str, Any], records: list[dict[str, Any]]) -> int:
    """Insert one folder's run and replay its history log into ``store``; returns its metric rows."""
    columns = [c for c in store.db["runs"].columns_dict if c not in ("run_dir", "config", "last_step")]
    row = {c: doc.get(c) for c in columns}
    row.update(config=json.dumps(doc.get("config") or {}), run_dir=folder.name)
    row["status"] = row["status"] if row.get("status") in STATUSES else "failed"
    row["cancel_requested"] = int(bool(row.get("cancel_requested")))
    row["created_at"] = row.get("created_at") or 0.0
    row["name"] = row.get("name") or folder.name
    metrics: dict[tuple[int, str], float | None] = {}
    probes: dict[tuple, list] = {}
    samples: dict[str, list] = {}
    for rec in records:
        kind, step = rec.get("kind"), rec.get("step")
        if not isinstance(step, int):
            continue
        if kind == "metrics":
            for key, value in (rec.get("values") or {}).items():
                metrics[(step, key)] = value
        elif kind == "probes":
            for r in rec.get("rows") or []:
                probes[(step, *r[:3])] = r[3:]
        elif kind == "samples":
            for r in rec.get("rows") or []:
                samples[r[0]] = r[1:]
        elif kind == "truncate":
            metrics = {k: v for k, v in metrics.items() if k[0] <= step}
            probes = {k: v for k, v in probes.items() if k[0] <= step}
            samples = {k: v for k, v in samples.items() if v[0] <= step}
    run_id = int(doc["id"])
    with store._lock, store.db.conn:
        names = list(row)
        store.db.execute(
            f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
            [row[n] for n in names],
        )
        store.db.conn.executemany(
            "INSERT INTO metrics (run_id, step, key, value) VALUES (?, ?, ?, ?)",
            [(run_id, s, k, v) for (s, k), v in metrics.items()],
        )
        store.db.conn.executemany(
            "INSERT INTO probes (run_id, step, batch, group_index, method, t_start, t_end, cosine, rel_error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(run_id, *k, *v) for k, v in probes.items()],
        )
        store.db.conn.executemany(
            "INSERT INTO samples (run_id, path, step, kind, prompt, seed, reward) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, path, *v) for path, v in samples.items()],
        )
        store._refill_latest(run_id)
        store.db.execute(
            "UPDATE runs SET last_step = (SELECT MAX(step) FROM metrics WHERE run_id = ?) WHERE id = ?",
            [run_id, run_id],
        )
    return len(metrics)
