"""The SQLite index of a runs root: ``<runs_dir>/jagg.db`` and every statement that reads or writes it.

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
pick_groups (run_id, step, group_index) → prompt, paths (JSON list, relative to run_dir), status (pending |
         closed), created_at: the groups a ``picks`` run asks its person about (:mod:`jagg_engine.rewards.picks`)
votes    (run_id, step, group_index, voter) → sample (NULL for a skip), choice (best | worst | skip), created_at:
         one vote per group and voter, committed before the trainer reads it; kept by truncations (a resumed
         run replays its steps and reuses every vote already cast)

Opened in WAL mode with a busy timeout, so the trainer (writer) and the app / ``jagg runs`` (readers) use it
at once; every query is parameterized; every write is one short transaction (:meth:`Index.writing`), which
holds the runs root's index lock shared (:func:`.locks.index_shared`), so ``jagg reindex`` can swap the file
and a store open meanwhile reopens the new one (:attr:`Index.db`).

Integrity: at open, ``PRAGMA quick_check``; a corrupt or unopenable ``jagg.db`` (a flipped header, a
malformed page, a directory in its place) raises :class:`CorruptIndexError`, one line naming the file and
the way out. Read-only: on a folder it cannot write (a read-only mount, a full disk where the WAL files
cannot be made) the index opens read-only (``mode=ro``, else ``immutable=1``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sqlite import sqlite_utils

if TYPE_CHECKING:  # pandas is imported where a frame is built: `jagg runs` starts without it
    import pandas as pd

from .base import (
    DB_NAME,
    FINAL_REWARD_KEYS,
    INDEX_LOCK,
    REINDEX_HINT,
    STATUSES,
    CorruptIndexError,
    StoreError,
    missing_index_message,
    new_uid,
    one_line,
    resolve_dir,
    run_folders_with_files,
    storage_refusal,
    stored_dir,
)
from .locks import index_shared
from .sqlite import WRITE_WAIT_S, BusyWait, _connect, _connect_read_only, begin_immediate, is_busy  # noqa: F401
from .votes import PICK_GROUP_STATUSES, VOTE_CHOICES, VOTE_TABLES, VoteTables  # noqa: F401 (re-exported)

WAL_SIZE_LIMIT = 1 << 20  # bytes the -wal file is truncated to after a checkpoint
METRIC_TABLES = ("metrics", "latest", "probes", "samples")
# what ensure_schema makes: the tables and the indexes
SCHEMA_OBJECTS = (
    "runs",
    *METRIC_TABLES,
    *VOTE_TABLES,
    "runs_uid",
    "runs_status",
    "samples_step",
    "latest_key",
)


class Index(VoteTables):
    """One open ``jagg.db`` (or any SQLite file of its schema). Safe to share between threads (one lock)."""

    def __init__(self, path: str | os.PathLike[str], read_only: bool | None = None):
        """Open (creating if needed) the database; ``read_only`` None = read-only only when the folder
        cannot be written, True = always, False = never (a write-less folder raises)."""
        self.path = Path(path)
        self.lock = threading.RLock()
        self._asked = read_only
        self.depth = 0  # write transactions open now (no reopen inside one)
        self._ident: tuple[int, int] | None = None  # (device, inode) of the file this index has open
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
            waited = BusyWait(self.path)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.path.name == DB_NAME and self._index_fd is None:  # the index's own store: see reindex
                    self._index_fd = os.open(self.path.parent / INDEX_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
                while True:
                    conn = _connect(self.path)
                    try:
                        self._db = sqlite_utils.Database(conn)
                        self._ident = _file_id(self.path)
                        self._check_integrity()
                        self._db.enable_wal()
                        self._db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
                        self.ensure_schema()
                        self.relocate_run_dirs()
                        return
                    except sqlite3.OperationalError as exc:
                        if not is_busy(exc):
                            raise
                        conn.close()  # another process creates or converts the file: open again after it
                        waited.backoff()
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) and storage_refusal(exc) and self.path.is_file():
                    if read_only is False:
                        raise
                    self.read_only = True
                else:
                    raise CorruptIndexError(self._corrupt(one_line(exc))) from None
            except OSError as exc:
                if read_only is False or not storage_refusal(exc) or not self.path.is_file():
                    raise
                self.read_only = True
        try:
            self._db = sqlite_utils.Database(_connect_read_only(self.path))
            self._ident = _file_id(self.path)
            self._check_integrity()
        except sqlite3.DatabaseError as exc:
            raise CorruptIndexError(self._corrupt(one_line(exc))) from None

    @property
    def db(self) -> sqlite_utils.Database:
        """The open index. When ``jagg reindex`` has replaced the file since it was opened (another inode at
        :attr:`path`), it is reopened first, outside any transaction: every holder of this index (the app's
        History, its queue, its launches) goes on in the new file."""
        if self.depth == 0 and self._ident is not None and not self._db.conn.in_transaction:
            now = _file_id(self.path)
            if now is not None and now != self._ident:
                with self.lock:
                    if self.depth == 0 and _file_id(self.path) != self._ident:
                        with contextlib.suppress(sqlite3.Error):
                            self._db.conn.close()
                        self._open()
        return self._db

    @property
    def root(self) -> Path:
        return self.path.parent

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One write transaction, under the lock and a shared lock of the runs root's index
        (:data:`INDEX_LOCK`): ``jagg reindex`` holds it exclusively while it reads the folders and swaps the
        file, so a write waits for the new index and goes into it, never into the one being replaced.

        The outermost one starts with ``BEGIN IMMEDIATE`` (:func:`begin_immediate`): SQLite's write lock is
        taken first, waiting on another process's write, so no statement inside ever has to upgrade a read
        to a write (the one case where SQLite answers "database is locked" without waiting)."""
        with self.lock:
            outer = self.depth == 0
            if outer and self._index_fd is not None:
                index_shared(self._index_fd, self.path)
            try:
                conn = self.db.conn  # a replaced index is reopened here, before the transaction
                self.depth += 1
                try:
                    with conn:
                        if outer and not self.read_only and not conn.in_transaction:
                            begin_immediate(conn, self.path)
                        yield
                finally:
                    self.depth -= 1
            finally:
                if outer and self._index_fd is not None:
                    fcntl.flock(self._index_fd, fcntl.LOCK_UN)

    def _corrupt(self, why: str) -> str:
        return f"{self.path}: {why}; the run index is unusable: " + REINDEX_HINT.format(root=self.path.parent)

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` (SQLite's O(N) structural check); raises :class:`CorruptIndexError`."""
        rows = self.db.execute("PRAGMA quick_check(1)").fetchall()
        if not rows or rows[0][0] != "ok":
            raise CorruptIndexError(
                self._corrupt("quick_check: " + one_line(rows[0][0] if rows else "no answer"))
            )

    def close(self) -> None:
        self._ident = None  # a closed index is not reopened
        self._db.conn.close()
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None

    def checkpoint_wal(self) -> None:
        """Copy the WAL into the database file now (PASSIVE: never waits on readers)."""
        if self.read_only:
            return
        with self.lock:
            try:
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.OperationalError:
                pass  # busy: the next step's checkpoint copies both

    # ------------------------------------------------------------------ schema
    def ensure_schema(self) -> None:
        """Create the tables and indexes if they do not exist; safe to call any number of times. A current
        schema is only read (no write lock: opening a store never waits on a trainer's write)."""
        if self._schema_current():
            return
        with self.writing():
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
            self.create_vote_tables()
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

    def _schema_current(self) -> bool:
        """Whether every table, column and index :meth:`ensure_schema` makes is there, and every run has a uid."""
        names = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master").fetchall()}
        if not set(SCHEMA_OBJECTS) <= names:
            return False
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(runs)").fetchall()}
        if not {"pid_at", "launcher", "pair_mode", "uid"} <= columns:
            return False
        return self.db.execute("SELECT 1 FROM runs WHERE uid IS NULL LIMIT 1").fetchone() is None

    def _ensure_latest(self) -> None:
        """The ``latest`` summary table; a history written before it existed is filled from metrics once."""
        fresh = "latest" not in self.db.table_names()
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS latest (run_id INTEGER NOT NULL, key TEXT NOT NULL, step INTEGER NOT NULL,"
            " value REAL, PRIMARY KEY (run_id, key))"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS latest_key ON latest (key)")
        if fresh:
            self.refill_latest(None)

    def refill_latest(self, run_id: int | None) -> None:
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

    def relocate_run_dirs(self) -> None:
        """Rewrite absolute ``run_dir`` values (older versions, or a copied or moved runs folder) that
        :func:`.base.resolve_dir` places in this root as relative ones; once per open of a writable index."""
        rows = self.db.execute(
            "SELECT id, run_dir, uid FROM runs WHERE run_dir IS NOT NULL AND run_dir LIKE '/%'"
        ).fetchall()
        moved = []
        for run_id, stored, uid in rows:
            relative = stored_dir(self.root, resolve_dir(self.root, stored, uid))
            if relative != stored and not Path(relative).is_absolute():
                moved.append((relative, run_id))
        if moved:
            with self.writing():
                self.db.conn.executemany("UPDATE runs SET run_dir = ? WHERE id = ?", moved)

    # ------------------------------------------------------------------ runs rows
    def status(self, run_id: int) -> str:
        """The run's status; StoreError "no run with id N" when there is no such run."""
        row = self.db.execute("SELECT status FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return row[0]

    def next_id(self, highest_folder: int) -> int:
        """The id of the next run: above every id the index ever gave (AUTOINCREMENT's sequence) and above
        ``highest_folder`` (the largest ``run-NNNN`` of the root: an index that lost rows cannot hand out a
        folder's number)."""
        (known,) = self.db.execute(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'runs'), 0),"
            " COALESCE((SELECT MAX(id) FROM runs), 0))"
        ).fetchone()
        return max(int(known), highest_folder) + 1

    def insert_run(self, row: dict[str, Any]) -> int:
        """Insert a queued run (the columns given, a new uid) inside a write transaction; returns its id."""
        row = {**row, "status": "queued", "cancel_requested": 0, "uid": new_uid()}
        names = list(row)
        cur = self.db.execute(
            f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
            [row[n] for n in names],
        )
        return int(cur.lastrowid)

    def set_columns(self, run_id: int, **columns: Any) -> None:
        """Set columns of the run's row (names from this module's callers, values as parameters)."""
        names = list(columns)
        self.db.execute(
            f"UPDATE runs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?",
            [*(columns[n] for n in names), run_id],
        )

    def set_status(
        self, run_id: int, status: str, now: float, error: str | None, pid: int | None, pid_at: float | None
    ) -> None:
        """The row's side of a status change (checked by the caller against the transition table)."""
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

    def claim(self, run_id: int, expected: Sequence[str], pid: int, now: float) -> bool:
        """Running for ``pid`` only if the status is one of ``expected``: whether the row changed."""
        marks = ", ".join("?" for _ in expected)
        cur = self.db.execute(
            "UPDATE runs SET status = 'running', started_at = COALESCE(started_at, ?), finished_at = NULL,"
            f" error = NULL, cancel_requested = 0, pid = ?, pid_at = ? WHERE id = ? AND status IN ({marks})",
            [now, pid, now, run_id, *expected],
        )
        return cur.rowcount == 1

    def claim_launch(self, run_id: int, pid: int, now: float) -> bool:
        """The pid of a queued, never launched, not cancelled run, if it has none: whether the row changed."""
        cur = self.db.execute(
            "UPDATE runs SET pid = ?, pid_at = ? WHERE id = ? AND status = 'queued' AND pid IS NULL"
            " AND cancel_requested = 0",
            [pid, now, run_id],
        )
        return cur.rowcount == 1

    def replace_pid(self, run_id: int, old: int, new: int | None, now: float | None) -> bool:
        """The pid ``new`` only while it is ``old``: whether the row changed."""
        cur = self.db.execute(
            "UPDATE runs SET pid = ?, pid_at = ? WHERE id = ? AND pid = ?", [new, now, run_id, old]
        )
        return cur.rowcount == 1

    def mark_dead(self, run_id: int, status: str, pid: int, now: float, error: str) -> bool:
        """Failed with ``error``, only while the row still reads ``status`` and ``pid``."""
        cur = self.db.execute(
            "UPDATE runs SET status = 'failed', finished_at = ?, error = ? WHERE id = ? AND status = ? AND pid = ?",
            [now, error, run_id, status, pid],
        )
        return cur.rowcount == 1

    def active_with_pid(self) -> list[tuple]:
        """(id, pid, pid_at, status, run_dir, uid) of the queued and running runs that have a pid."""
        with self.lock:
            return self.db.execute(
                "SELECT id, pid, pid_at, status, run_dir, uid FROM runs"
                " WHERE status IN ('queued', 'running') AND pid IS NOT NULL"
            ).fetchall()

    def delete_run(self, run_id: int) -> None:
        """Every row of the run, and the pairing of runs paired with it."""
        for table in METRIC_TABLES + VOTE_TABLES:
            self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        self.db.execute("UPDATE runs SET paired_run_id = NULL WHERE paired_run_id = ?", [run_id])
        self.db.execute("DELETE FROM runs WHERE id = ?", [run_id])

    def row(self, run_id: int) -> dict[str, Any] | None:
        """The run's row as stored (config as JSON text), or None."""
        with self.lock:
            rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        return dict(rows[0]) if rows else None

    def rows(self) -> list[dict[str, Any]]:
        """Every run's row, newest first."""
        with self.lock:
            return [dict(r) for r in self.db.query("SELECT * FROM runs ORDER BY id DESC")]

    def uid(self, run_id: int) -> str:
        with self.lock:
            row = self.db.execute("SELECT uid FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return row[0]

    def cancel_requested(self, run_id: int) -> bool:
        with self.lock:
            row = self.db.execute("SELECT cancel_requested FROM runs WHERE id = ?", [run_id]).fetchone()
        if row is None:
            raise StoreError(f"no run with id {run_id}")
        return bool(row[0])

    # ------------------------------------------------------------------ metrics, probes, samples
    def insert_metrics(self, run_id: int, step: int, rows: list[tuple]) -> None:
        """Upsert (run_id, step, key, value) rows, keep ``latest`` and raise ``last_step``."""
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

    def insert_probes(self, rows: list[tuple]) -> None:
        self.db.conn.executemany(
            "INSERT INTO probes (run_id, step, batch, group_index, method, t_start, t_end, cosine, rel_error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id, step, batch, group_index, method) DO UPDATE SET t_start = excluded.t_start,"
            " t_end = excluded.t_end, cosine = excluded.cosine, rel_error = excluded.rel_error",
            rows,
        )

    def insert_samples(self, rows: list[tuple]) -> None:
        self.db.conn.executemany(
            "INSERT INTO samples (run_id, path, step, kind, prompt, seed, reward) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id, path) DO UPDATE SET step = excluded.step, kind = excluded.kind,"
            " prompt = excluded.prompt, seed = excluded.seed, reward = excluded.reward",
            rows,
        )

    def truncate_after(self, run_id: int, step: int) -> None:
        """Forget the run's rows after ``step``; ``latest`` and ``last_step`` follow."""
        for table in METRIC_TABLES:
            self.db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step > ?", [run_id, step])
        self.refill_latest(run_id)  # keys whose latest row went: their value at the new last step
        self.set_last_step(run_id)

    def set_last_step(self, run_id: int) -> None:
        self.db.execute(
            "UPDATE runs SET last_step = (SELECT MAX(step) FROM metrics WHERE run_id = ?) WHERE id = ?",
            [run_id, run_id],
        )

    def metrics_frame(self, run_id: int) -> pd.DataFrame:
        """Wide frame: one row per step (column ``step``, ascending), one column per metric key."""
        with self.lock:
            rows = self.db.execute(
                "SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step", [run_id]
            ).fetchall()
        return wide_frame(rows)

    def metrics_long(self, run_id: int) -> list[dict[str, Any]]:
        with self.lock:
            return list(
                self.db.query(
                    "SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step, key", [run_id]
                )
            )

    def probes(self, run_id: int) -> list[dict[str, Any]]:
        with self.lock:
            return list(
                self.db.query(
                    "SELECT * FROM probes WHERE run_id = ? ORDER BY step, batch, method, group_index",
                    [run_id],
                )
            )

    def samples(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM samples WHERE run_id = ?" + (" AND kind = ?" if kind else "")
        with self.lock:
            return list(self.db.query(sql + " ORDER BY step, path", [run_id, kind] if kind else [run_id]))

    def sample_count(self, run_id: int) -> tuple[int, int | None]:
        """(number of sample rows, largest step) of a run, through the (run_id, step) index."""
        with self.lock:
            count, last = self.db.execute(
                "SELECT COUNT(*), MAX(step) FROM samples WHERE run_id = ?", [run_id]
            ).fetchone()
        return int(count), last

    def last_values(self, run_id: int, keys: Sequence[str]) -> dict[str, tuple[int, float | None]]:
        """For each key that was logged: (step, value) at the largest step."""
        if not keys:
            return {}
        marks = ", ".join("?" for _ in keys)
        with self.lock:
            rows = self.db.execute(
                f"SELECT key, step, value FROM {self._latest()} WHERE run_id = ? AND key IN ({marks})",
                [run_id, *keys],
            ).fetchall()
        return {key: (step, value) for key, step, value in rows}

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

    def final_rewards(self) -> dict[int, tuple[str, float | None]]:
        """run_id → (key, value at its last step) for the first of FINAL_REWARD_KEYS each run logged."""
        marks = ", ".join("?" for _ in FINAL_REWARD_KEYS)
        with self.lock:
            rows = self.db.execute(
                f"SELECT run_id, key, value FROM {self._latest()} WHERE key IN ({marks})",
                list(FINAL_REWARD_KEYS),
            ).fetchall()
        found: dict[int, dict[str, float | None]] = {}
        for run_id, key, value in rows:
            found.setdefault(run_id, {})[key] = value
        return {
            run_id: next((k, values[k]) for k in FINAL_REWARD_KEYS if k in values)
            for run_id, values in found.items()
        }


def wide_frame(rows: list[tuple[int, str, float | None]]) -> pd.DataFrame:
    """(step, key, value) rows as a wide frame: one row per step (column ``step``, ascending), one column per
    key (sorted); pandas is imported here, so the torch-free commands that never build a frame never load it."""
    import pandas as pd

    if not rows:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    long = pd.DataFrame(rows, columns=["step", "key", "value"]).astype({"value": "float64"})
    wide = long.pivot(index="step", columns="key", values="value").sort_index()
    wide = wide.reindex(sorted(wide.columns), axis=1)
    wide.columns.name = None
    return wide.reset_index()


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _unwritable(db_path: Path) -> bool:
    """Whether the database (or the folder that would hold it) exists and cannot be written."""
    for path in (db_path, db_path.parent):
        if path.exists():
            return not os.access(path, os.W_OK)
    return False
