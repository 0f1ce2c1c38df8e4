"""``RunStore``: every read and write of the run history, as one object over the parts that keep it.

A change of a run's row is one transaction of the index (:mod:`.index`) in which the run's ``run.json`` is
rewritten and a ``run`` record appended to its ``history.jsonl`` (:mod:`.history`); a logged step, probe,
sample or truncation appends its record in the same transaction as its rows (a failed append rolls the rows
back, a failed commit cuts the record off the file again). Deletes hold the run folder's lock
(:mod:`.locks`). The store does not know about ranks: only the main process of a run writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sqlite import sqlite_utils

if TYPE_CHECKING:  # pandas is imported where a frame is built: `jagg runs` starts without it
    import pandas as pd

from . import history, locks
from .base import (
    ACTIVE_STATUSES,
    LAUNCHERS,
    PAIR_MODES,
    RUN_FILE_FORMAT,
    SAMPLE_KINDS,
    STATUSES,
    TRANSITIONS,
    ClaimError,
    StoreError,
    highest_folder_id,
    owned_folder,
    resolve_dir,
    slug,
    stored_dir,
)
from .index import PICK_GROUP_STATUSES, VOTE_CHOICES, Index, wide_frame


class RunStore:
    """All reads and writes of the run history. Safe to share between threads (one lock per store)."""

    def __init__(self, db_path: str | os.PathLike[str], read_only: bool | None = None):
        """Open (creating if needed) the database; ``read_only`` None = read-only only when the folder
        cannot be written (a read-only mount, a full disk), True = always, False = never (a write-less
        folder raises)."""
        self.index = Index(db_path, read_only)
        self.path = self.index.path
        self._lock = self.index.lock
        self._undo_append: tuple[Path, int] | None = None

    @property
    def db(self) -> sqlite_utils.Database:
        """The open index (reopened first when ``jagg reindex`` has replaced the file: :attr:`Index.db`)."""
        return self.index.db

    @property
    def read_only(self) -> bool:
        return self.index.read_only

    @property
    def runs_root(self) -> Path:
        return self.path.parent

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_schema(self) -> None:
        """Create the tables and indexes if they do not exist; safe to call any number of times."""
        self.index.ensure_schema()

    def _refill_latest(self, run_id: int | None) -> None:
        self.index.refill_latest(run_id)

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        return self.index.writing()

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
        self._check_new(launcher, paired_run_id)
        with self._writing():
            run_id = self.index.insert_run(
                self._new_row(
                    self._next_id(), name, config, self._stored_dir(run_dir), paired_run_id, launcher, pid
                )
            )
            self._write_run_file(run_id)
        self.checkpoint_wal()
        return run_id

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
        self._check_new(launcher, paired_run_id)
        root = self.runs_root.resolve()
        for _ in range(1000):
            try:
                with self._writing():
                    run_id = self._next_id()
                    folder = root / f"run-{run_id:04d}"
                    self.index.insert_run(
                        self._new_row(run_id, name, config, folder.name, paired_run_id, launcher, pid)
                    )
                    folder.mkdir()  # exclusive: FileExistsError rolls the insert back
                    self._write_run_file(run_id)
                self.checkpoint_wal()
                return run_id, folder
            except FileExistsError:
                continue
        raise StoreError(f"runs folder {root}: no free run-NNNN folder name found")

    def _check_new(self, launcher: str | None, paired_run_id: int | None) -> None:
        self._check_writable()
        if launcher is not None and launcher not in LAUNCHERS:
            raise StoreError(f"launcher: must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        if paired_run_id is not None:
            self._require(paired_run_id)

    @staticmethod
    def _new_row(
        run_id: int,
        name: str,
        config: Mapping[str, Any],
        run_dir: str | None,
        paired_run_id: int | None,
        launcher: str | None,
        pid: int | None,
    ) -> dict[str, Any]:
        now = time.time()
        return {
            "id": run_id,
            "name": name,
            "config": json.dumps(dict(config)),
            "created_at": now,
            "run_dir": run_dir,
            "paired_run_id": paired_run_id,
            "launcher": launcher,
            "pid": pid,
            "pid_at": now if pid is not None else None,
        }

    def _next_id(self) -> int:
        """The id of the next run: above every id the index ever gave and every ``run-NNNN`` folder."""
        return self.index.next_id(highest_folder_id(self.runs_root))

    def set_run_dir(self, run_id: int, run_dir: str | os.PathLike[str]) -> None:
        """Record the run folder (when it is named after the id, it is known only after create_run)."""
        self._set(run_id, run_dir=self._stored_dir(run_dir))

    def set_paired(self, run_id: int, paired_run_id: int | None) -> None:
        self._check_writable()
        self._require(run_id)
        if paired_run_id is not None:
            self._require(paired_run_id)
        self._set(run_id, paired_run_id=paired_run_id)

    def set_pair_mode(self, run_id: int, mode: str | None) -> None:
        """How the app schedules ``run_id`` and its paired run (:data:`PAIR_MODES`; None: not a pair)."""
        self._check_writable()
        self._require(run_id)
        if mode is not None and mode not in PAIR_MODES:
            raise StoreError(f"pair_mode: must be one of {', '.join(PAIR_MODES)}, got {mode!r}")
        self._set(run_id, pair_mode=mode)

    def _set(self, run_id: int, **columns: Any) -> None:
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.index.set_columns(run_id, **columns)
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
            current = self.index.status(run_id)
            if status not in TRANSITIONS[current]:
                allowed = ", ".join(TRANSITIONS[current]) or "nothing"
                raise StoreError(f"run {run_id}: cannot go from {current} to {status} (allowed: {allowed})")
            self.index.set_status(run_id, status, now, error, pid, pid_at)
            self._write_run_file(run_id)
        self.checkpoint_wal()

    def claim(self, run_id: int, expected: Iterable[str], pid: int) -> None:
        """Mark the run running for the trainer ``pid`` only if its status is one of ``expected`` (what
        the trainer was started for: queued, or failed/cancelled for a resume): a compare-and-set in one
        transaction. Raises :class:`ClaimError` (the status untouched) when another trainer took it."""
        self._check_writable()
        expected = tuple(expected)
        with self._writing():
            if not self.index.claim(run_id, expected, pid, time.time()):
                status = self.index.status(run_id)
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
            taken = self.index.claim_launch(run_id, pid, time.time())
            if taken:
                self._write_run_file(run_id, logged=False)
            return taken

    def replace_pid(self, run_id: int, old: int, new: int | None) -> bool:
        """Set the run's pid to ``new`` only while it is ``old`` (a launcher hands its claim to its child, or
        gives it back with None when the child could not start)."""
        self._check_writable()
        with self._writing():
            changed = self.index.replace_pid(run_id, old, new, None if new is None else time.time())
            if changed:
                self._write_run_file(run_id, logged=False)
            return changed

    def set_pid(self, run_id: int, pid: int | None) -> None:
        """Record the process that runs (or will run) this run, e.g. right after the app spawns it."""
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.index.set_columns(run_id, pid=pid, pid_at=time.time() if pid is not None else None)
            self._write_run_file(run_id, logged=False)

    def set_times(
        self, run_id: int, created_at: float, started_at: float | None, finished_at: float | None
    ) -> None:
        """Set the run's recorded times (a history loaded from elsewhere keeps the times it was recorded at)."""
        self._require(run_id)
        with self._writing():
            self.index.set_columns(
                run_id, created_at=created_at, started_at=started_at, finished_at=finished_at
            )
            if not self.read_only:
                self._write_run_file(run_id)

    def request_cancel(self, run_id: int) -> None:
        """Ask a run to stop; the trainer polls :meth:`cancel_requested` before each step, its update and its eval."""
        self._check_writable()
        self._require(run_id)
        with self._writing():
            self.index.set_columns(run_id, cancel_requested=1)

    def cancel_requested(self, run_id: int) -> bool:
        return self.index.cancel_requested(run_id)

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        """The run's row with ``config`` decoded to a dict, or None."""
        row = self.index.row(run_id)
        return self._decode_run(row) if row is not None else None

    def list_runs(self) -> list[dict[str, Any]]:
        """All runs, newest first, with ``config`` decoded and ``final_reward`` / ``final_reward_key`` added.

        Reads the runs and ``latest`` tables only (never metrics): its cost does not grow with the history."""
        with self._lock:
            runs = [self._decode_run(r) for r in self.index.rows()]
            finals = self.index.final_rewards()
        for run in runs:
            key, value = finals.get(run["id"], (None, None))
            run["final_reward_key"], run["final_reward"] = key, value
        return runs

    def last_values(self, run_id: int, keys: Iterable[str]) -> dict[str, tuple[int, float | None]]:
        """For each key that was logged: (step, value) at the largest step."""
        return self.index.last_values(run_id, list(keys))

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
            and locks.pid_alive(run["pid"], run["pid_at"])
        ):
            raise StoreError(f"run {run_id}: is {run['status']} (pid {run['pid']}); cancel it first")
        folder = Path(run["run_dir"]) if run["run_dir"] else None
        held = (
            locks.RunLock.exclusive(
                folder, f"run {run_id}: a trainer holds its folder{{holder}}; cancel it first"
            )
            if folder is not None and folder.is_dir()
            else contextlib.nullcontext()
        )
        with held:  # no trainer takes the run while its rows and folder go
            with self._writing():
                self._write_run_file(
                    run_id, deleted=True
                )  # a folder kept on disk is not brought back by reindex
                self.index.delete_run(run_id)
            owned = owned_folder(self.runs_root, run["run_dir"])
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
            self.index.status(run_id)
            self._append_history(
                run_id, {"kind": "metrics", "step": int(step), "values": {r[2]: r[3] for r in rows}}
            )
            self.index.insert_metrics(run_id, step, rows)
        self.checkpoint_wal()

    def checkpoint_wal(self) -> None:
        """Copy the WAL into the database file now (PASSIVE: never waits on readers), so the ``-wal`` file
        holds at most the steps since; ``journal_size_limit`` keeps the file itself small."""
        self.index.checkpoint_wal()

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
            self.index.status(run_id)
            self._append_history(
                run_id, {"kind": "probes", "step": int(step), "rows": [list(r[2:]) for r in rows]}
            )
            self.index.insert_probes(rows)

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
            self.index.status(run_id)
            self._append_history(
                run_id, {"kind": "samples", "step": int(step), "rows": [list(r[1:]) for r in rows]}
            )
            self.index.insert_samples(rows)

    def truncate_after(self, run_id: int, step: int) -> None:
        """Forget metrics, probes and samples logged after ``step`` and set last_step to it (or lower).

        A resumed run calls this with its checkpoint's step, so rows of the steps it replays are written
        fresh and nothing logged after the checkpoint by the crashed process survives.
        """
        self._check_writable()
        with self._logging_transaction():
            self.index.status(run_id)
            self._append_history(run_id, {"kind": "truncate", "step": int(step)})
            self.index.truncate_after(run_id, step)

    # ------------------------------------------------------------------ picks: groups asked, votes cast
    def post_pick_groups(self, run_id: int, step: int, groups: Iterable[Mapping[str, Any]]) -> None:
        """The groups of ``step`` the run asks its person about, pending until :meth:`close_pick_groups`: each
        has group_index, prompt and paths (the group's images, relative to run_dir, in sample order). Votes
        already cast on a group (a resumed run replays the step) are kept. Not in the history log: a resumed
        run asks again about the groups still without a vote."""
        self._check_writable()
        now = time.time()
        rows = []
        for g in groups:
            paths = [str(p) for p in g["paths"]]
            if any(Path(p).is_absolute() or ".." in Path(p).parts for p in paths):
                raise StoreError(f"pick group paths: must be relative to the run folder, got {paths!r}")
            rows.append((run_id, int(step), int(g["group_index"]), g.get("prompt"), json.dumps(paths), now))
        with self._writing():
            self.index.status(run_id)
            self.index.insert_pick_groups(rows)

    def close_pick_groups(self, run_id: int, step: int | None = None) -> None:
        """No more votes on the run's pending groups (of ``step``, or all): the run went on without them."""
        self._check_writable()
        with self._writing():
            self.index.close_pick_groups(run_id, step)

    def pick_groups(self, run_id: int | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Groups asked (one run's or every run's; ``status`` pending | closed | None = both), ``paths`` decoded
        and ``size`` = the group's sample count."""
        if status is not None and status not in PICK_GROUP_STATUSES:
            raise StoreError(
                f"pick group status: must be one of {', '.join(PICK_GROUP_STATUSES)}, got {status!r}"
            )
        rows = self.index.pick_groups(run_id, status)
        for r in rows:
            r["paths"] = json.loads(r["paths"])
            r["size"] = len(r["paths"])
        return rows

    def cast_vote(
        self, run_id: int, step: int, group_index: int, sample: int | None, choice: str, voter: str
    ) -> dict[str, Any]:
        """One person's vote on one group: ``choice`` best | worst (``sample`` the group's sample index) or skip
        (``sample`` None). Committed (and appended to the run's history log) before it returns, so a process
        killed right after loses nothing. Refused in one line (:class:`StoreError`), nothing written: an
        unknown run, a run that is cancelled or not running, a run that does not train on picks, a voter other
        than the run's (``reward_options.picks.voter``), a group the run never asked, a sample outside the
        group, a second vote of the same voter on the group. A vote on a group its step closed without one (the
        step timed out and went on) is kept, ``late`` True in the returned row: the preference model learns
        from it at the run's next step."""
        self._check_writable()
        if choice not in VOTE_CHOICES:
            raise StoreError(f"vote choice: must be one of {', '.join(VOTE_CHOICES)}, got {choice!r}")
        if (choice == "skip") != (sample is None):
            raise StoreError(
                f"vote sample: a {choice} needs {'no sample' if choice == 'skip' else 'a sample index'}"
            )
        where = f"group {group_index} of step {step} of run {run_id}"
        with self._logging_transaction():
            row = self.index.row(run_id)
            if row is None:
                raise StoreError(f"vote: no run with id {run_id}")
            if row["cancel_requested"] or row["status"] == "cancelled":
                raise StoreError(f"vote: run {run_id} was cancelled; no vote is taken")
            if row["status"] != "running":
                raise StoreError(f"vote: run {run_id} is {row['status']}; votes are taken only while it runs")
            config = json.loads(row["config"])
            if "picks" not in (config.get("rewards") or {}):
                raise StoreError(f"vote: run {run_id} does not train on picks")
            allowed = str(((config.get("reward_options") or {}).get("picks") or {}).get("voter", "owner"))
            if voter != allowed:
                raise StoreError(f"vote: run {run_id} takes votes from {allowed!r} only, not from {voter!r}")
            group = [
                g
                for g in self.index.pick_groups(run_id, None)
                if (g["step"], g["group_index"]) == (step, group_index)
            ]
            if not group:
                raise StoreError(f"vote: {where} was never asked (no such group)")
            cast = [
                v
                for v in self.index.votes(run_id, step)
                if (v["group_index"], v["voter"]) == (group_index, voter)
            ]
            if cast:
                raise StoreError(
                    f"vote: {voter!r} already voted on {where} ({cast[0]['choice']}"
                    f"{'' if cast[0]['sample'] is None else ' ' + str(cast[0]['sample'])}); one vote per group"
                )
            late = group[0]["status"] != "pending"
            size = len(json.loads(group[0]["paths"]))
            if sample is not None and not 0 <= int(sample) < size:
                raise StoreError(f"vote sample: must be in 0..{size - 1} for {where}, got {sample}")
            vote = {
                "run_id": run_id,
                "step": int(step),
                "group_index": int(group_index),
                "voter": voter,
                "sample": None if sample is None else int(sample),
                "choice": choice,
                "created_at": time.time(),
            }
            self._append_history(run_id, {"kind": "vote", "step": int(step), "row": list(vote.values())[2:]})
            self.index.insert_vote(tuple(vote.values()))
        return {**vote, "late": late}

    def votes(self, run_id: int, step: int | None = None) -> list[dict[str, Any]]:
        """The run's votes (of one step, or all), in the order they were cast."""
        return self.index.votes(run_id, step)

    # ------------------------------------------------------------------ reading
    def metrics_frame(self, run_id: int) -> pd.DataFrame:
        """Wide frame: one row per step (column ``step``, ascending), one column per metric key."""
        return self.index.metrics_frame(run_id)

    def metric_series(self, run_id: int, keys: Iterable[str]) -> pd.DataFrame:
        """Like :meth:`metrics_frame` for ``keys`` only (a view that polls a few curves of a long run)."""
        keys = list(keys)
        marks = ", ".join("?" for _ in keys)
        with self._lock:
            rows = self.db.execute(
                f"SELECT step, key, value FROM metrics WHERE run_id = ? AND key IN ({marks}) ORDER BY step",
                [run_id, *keys],
            ).fetchall()
        return wide_frame(rows)

    def probes(self, run_id: int) -> list[dict[str, Any]]:
        return self.index.probes(run_id)

    def samples(self, run_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        return self.index.samples(run_id, kind)

    def sample_count(self, run_id: int) -> tuple[int, int | None]:
        """(number of sample rows, largest step) of a run, through the (run_id, step) index."""
        return self.index.sample_count(run_id)

    def export_run(self, run_id: int, out_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``run-<id>-<name>.csv`` (the wide metrics frame) and ``run-<id>-<name>.json`` (the run
        row with its config, every metric in long form, probes, samples and the votes of a picks run). Returns
        (csv_path, json_path)."""
        run = self.get_run(run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"run-{run_id}-{slug(run['name'])}"
        csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
        self.metrics_frame(run_id).to_csv(csv_path, index=False)
        doc = {
            "run": run,
            "metrics": self.index.metrics_long(run_id),
            "probes": self.probes(run_id),
            "samples": self.samples(run_id),
            "votes": self.votes(run_id),
        }
        json_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return csv_path, json_path

    def check_liveness(self) -> list[int]:
        """Mark queued/running runs whose process is gone as failed, with the tail of run_dir/train.log.

        Only runs with a recorded pid are checked (a queued run without one has not been launched). The
        update is conditional on the status and pid read, so a run that finishes meanwhile keeps its
        status. Returns the ids marked failed. A store that cannot write (read-only, disk full) marks nothing
        and shows the runs as they are.
        """
        return locks.check_liveness(self)

    def uid(self, run_id: int) -> str:
        """The run's unique id (its checkpoints carry it)."""
        return self.index.uid(run_id)

    # ------------------------------------------------------------------ the run folder
    def _stored_dir(self, run_dir: str | os.PathLike[str] | None) -> str | None:
        return stored_dir(self.runs_root, run_dir)

    def _resolve_dir(self, stored: str | None, uid: str | None) -> str | None:
        return resolve_dir(self.runs_root, stored, uid)

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
        from which :func:`.reindex.reindex` rebuilds a run whose ``run.json`` is unreadable; changes of the
        pid alone are not logged."""
        folder = self._folder_of(run_id)
        if folder is None:
            return
        row = dict(next(iter(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))))
        row["config"] = json.loads(row["config"])
        row.pop("run_dir", None)  # the folder is where the file is
        doc = {"format": RUN_FILE_FORMAT, **row, **({"deleted": True} if deleted else {})}
        if logged:
            self._append_history(run_id, {"kind": "run", "row": doc})
        history.write_run_file(folder, doc)

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
        run's uid and a checksum (:func:`.history.history_line`). NaN is written as null, as SQLite stores it;
        ±inf as JSON's Infinity."""
        folder = self._folder_of(run_id)
        if folder is None:
            return
        line = history.history_line({**record, "uid": self.uid(run_id)})
        self._undo_append = path, size = history.history_end(folder)
        history.append_line(path, size, line)

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"runs folder {self.runs_root} is read-only: nothing was written")

    def _status(self, run_id: int) -> str:
        return self.index.status(run_id)

    def _require(self, run_id: int) -> None:
        with self._lock:
            self.index.status(run_id)


def open_store(runs_dir: str | os.PathLike[str], read_only: bool | None = None) -> RunStore:
    """The store of a runs root: ``<runs_dir>/jagg.db`` (read-only where the folder cannot be written)."""
    from .base import DB_NAME

    return RunStore(Path(runs_dir) / DB_NAME, read_only=read_only)
