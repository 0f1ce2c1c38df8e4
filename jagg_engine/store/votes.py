"""The run index's tables of a ``picks`` run (:mod:`jagg_engine.rewards.picks`): the groups asked and the votes
cast, a part of :class:`jagg_engine.store.index.Index` (its writes run inside the index's transactions)."""

from __future__ import annotations

import threading
from typing import Any

from .sqlite import Database

VOTE_TABLES = ("pick_groups", "votes")  # deleted with the run, never truncated
VOTE_CHOICES = ("best", "worst", "skip")
PICK_GROUP_STATUSES = ("pending", "closed")


class VoteTables:
    """pick_groups (run_id, step, group_index) → prompt, paths, status, created_at; votes (run_id, step,
    group_index, voter) → sample, choice, created_at. The index supplies ``db`` and ``lock``."""

    db: Database
    lock: threading.RLock

    def create_vote_tables(self) -> None:
        """Both tables, if they are not there (inside :meth:`Index.ensure_schema`'s transaction)."""
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS pick_groups (run_id INTEGER NOT NULL, step INTEGER NOT NULL,"
            " group_index INTEGER NOT NULL, prompt TEXT, paths TEXT NOT NULL,"
            f" status TEXT NOT NULL CHECK (status IN ({', '.join(map(repr, PICK_GROUP_STATUSES))})),"
            " created_at REAL NOT NULL, PRIMARY KEY (run_id, step, group_index))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS votes (run_id INTEGER NOT NULL, step INTEGER NOT NULL,"
            " group_index INTEGER NOT NULL, voter TEXT NOT NULL, sample INTEGER,"
            f" choice TEXT NOT NULL CHECK (choice IN ({', '.join(map(repr, VOTE_CHOICES))})),"
            " created_at REAL NOT NULL, PRIMARY KEY (run_id, step, group_index, voter))"
        )

    def insert_pick_groups(self, rows: list[tuple]) -> None:
        """(run_id, step, group_index, prompt, paths JSON, created_at) as pending; a group asked again (a
        resumed run replays its step) is pending again, its votes untouched."""
        self.db.conn.executemany(
            "INSERT INTO pick_groups (run_id, step, group_index, prompt, paths, status, created_at)"
            " VALUES (?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT (run_id, step, group_index) DO UPDATE SET"
            " prompt = excluded.prompt, paths = excluded.paths, status = 'pending',"
            " created_at = excluded.created_at",
            rows,
        )

    def close_pick_groups(self, run_id: int, step: int | None = None) -> None:
        """Pending groups of the run (of one step, or all) closed: no vote is taken on them any more."""
        where, args = ("AND step = ?", [run_id, step]) if step is not None else ("", [run_id])
        self.db.execute(f"UPDATE pick_groups SET status = 'closed' WHERE run_id = ? {where}", args)

    def pick_groups(self, run_id: int | None, status: str | None = None) -> list[dict[str, Any]]:
        """Groups asked (of one run or all), by run, step and group."""
        clauses, args = [], []
        if run_id is not None:
            clauses.append("run_id = ?")
            args.append(run_id)
        if status is not None:
            clauses.append("status = ?")
            args.append(status)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        with self.lock:
            return [
                dict(r)
                for r in self.db.query(
                    f"SELECT * FROM pick_groups {where} ORDER BY run_id, step, group_index", args
                )
            ]

    def insert_vote(self, row: tuple) -> None:
        """(run_id, step, group_index, voter, sample, choice, created_at); a second vote raises IntegrityError."""
        self.db.execute(
            "INSERT INTO votes (run_id, step, group_index, voter, sample, choice, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            list(row),
        )

    def votes(self, run_id: int, step: int | None = None) -> list[dict[str, Any]]:
        """The run's votes (of one step, or all), in the order they were cast."""
        where, args = ("AND step = ?", [run_id, step]) if step is not None else ("", [run_id])
        with self.lock:
            return [
                dict(r)
                for r in self.db.query(
                    f"SELECT * FROM votes WHERE run_id = ? {where} ORDER BY created_at, step, group_index",
                    args,
                )
            ]
