"""``jagg reindex``: rebuild a runs root's ``jagg.db`` from its run folders (``run.json`` + ``history.jsonl``):
the ``run-NNNN`` folders and the named ones (:func:`named_run_folders`, e.g. the app's ``showcase/<key>``),
each under the id its ``run.json`` carries, so that no id is handed out again.

Each folder's history is replayed (:func:`.history.read_history` skips a torn, garbage, foreign or flipped
line, each listed); a run whose ``run.json`` is unreadable is rebuilt from the ``run`` records its history
logged or, without them, kept from the old index. The rebuild holds the index lock exclusively
(:func:`.locks.index_exclusive`), is refused while a trainer holds a run folder, and is atomic: the new
index is built beside the old one, which is kept as ``jagg.db.before-reindex-<time>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import (
    BUSY_TIMEOUT_S,
    DB_NAME,
    HISTORY_FILE,
    RUN_FILE,
    RUN_FOLDER,
    STATUSES,
    StoreError,
    folder_number,
    new_uid,
    one_line,
    stored_dir,
)
from .history import History, read_history, rewrite_uid, write_run_file
from .locks import RunLock, index_exclusive
from .run_store import RunStore


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
        why = f"{folder / RUN_FILE}: unreadable ({one_line(exc)})"
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
        conn = sqlite3.connect(
            "file:" + urllib.parse.quote(str(db.resolve())) + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S
        )
        try:
            conn.row_factory = sqlite3.Row
            return {int(r["id"]): dict(r) for r in conn.execute("SELECT * FROM runs")}
        finally:
            conn.close()
    except sqlite3.Error:
        return {}


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
        numbered = sorted(
            (p for p in root.iterdir() if RUN_FOLDER.match(p.name) and p.is_dir() and not p.is_symlink()),
            key=lambda p: int(RUN_FOLDER.match(p.name).group(1)),
        )
        return numbered + named_run_folders(root)

    def refuse_busy(found: list[Path]) -> None:
        busy = [p.name for p in found if RunLock.held_elsewhere(p)]
        if busy:
            raise StoreError(f"runs dir: {', '.join(busy)} training now; stop it before `jagg reindex`")

    refuse_busy(folders())
    report = ReindexReport()
    db = root / DB_NAME
    with index_exclusive(root):
        found = folders()  # again under the lock: a run created meanwhile is in
        refuse_busy(found)
        old_rows = _old_index_rows(db)
        building = root / f".{DB_NAME}.reindex"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        entries: list[_Entry] = []
        for folder in found:
            try:
                doc, history, rebuilt = read_run_folder(folder, old_rows)
            except StoreError as exc:
                report.skipped.append(str(exc))
                continue
            if doc.get("deleted"):
                report.skipped.append(f"{folder}: run {doc['id']} was deleted from the history")
                continue
            entries.append(_Entry(folder, doc, history, rebuilt))
        _settle_identities(entries, report)
        new = RunStore(building, read_only=False)
        try:
            for entry in entries:
                doc, history = entry.doc, entry.history
                if entry.rebuilt:
                    report.rebuilt.append(f"run {doc['id']}: {entry.rebuilt}")
                if history.skipped:
                    report.lines[doc["id"]] = history.skipped
                if history.unverified:
                    report.unverified[doc["id"]] = history.unverified
                report.runs[doc["id"]] = _index_folder(new, entry.folder, doc, history.records)
            new.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            new.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{building}{suffix}").unlink(missing_ok=True)
        _swap_in(building, db, report)
    return report


def named_run_folders(root: Path) -> list[Path]:
    """The run folders of ``root`` not named ``run-NNNN``: a folder that holds a ``run.json``, directly in the
    root or one level down in another folder (the app's showcase runs: ``showcase/<key>``; a run made with
    ``run_dir=`` a named folder). Hidden folders, symlinks and the inside of ``run-NNNN`` folders are not
    looked at."""

    def visible_dirs(folder: Path) -> list[Path]:
        try:
            children = sorted(folder.iterdir())
        except OSError:
            return []
        return [p for p in children if not p.name.startswith(".") and p.is_dir() and not p.is_symlink()]

    found = []
    for top in visible_dirs(root):
        if RUN_FOLDER.match(top.name):
            continue
        if (top / RUN_FILE).is_file():
            found.append(top)
            continue
        found += [sub for sub in visible_dirs(top) if (sub / RUN_FILE).is_file()]
    return found


@dataclass
class _Entry:
    """A run folder as read for the index: its row, its history and how the row was had."""

    folder: Path
    doc: dict[str, Any]
    history: History
    rebuilt: str | None


def _settle_identities(entries: list[_Entry], report: ReindexReport) -> None:
    """Give every run its own uid and id before any is indexed, so that no run is lost to another's.

    A uid that several folders' ``run.json`` carry (one was pasted or copied from another) stays with the
    GENUINE run, the folder whose history lines carry it most (a tie: the earlier folder). Each other one
    takes the uid its own history's lines carry when no folder claims it (a pasted uid: its checkpoints carry
    that one too), else a new uid, its history's lines rewritten to it (a copied folder). An id that several
    rows carry stays with the folder of that number (else the earlier one); each other takes its folder's
    number, or the next free id. A run given a new identity has its ``run.json`` rewritten, so later writes
    and reindexes agree, and is reported in one line (``report.rebuilt``)."""
    notes: dict[int, list[str]] = {}
    by_uid: dict[str, list[_Entry]] = {}
    for entry in entries:
        by_uid.setdefault(entry.doc["uid"], []).append(entry)
    claimed = set(by_uid)
    for uid, group in by_uid.items():
        if len(group) < 2:
            continue
        genuine = max(group, key=lambda e: (_lines_of(e, uid), -entries.index(e)))
        for entry in group:
            if entry is genuine:
                continue
            own = Counter(
                r["uid"]
                for r in read_history(entry.folder / HISTORY_FILE, None).records
                if r.get("uid") and r["uid"] not in claimed
            )
            if own:
                new_uid_, how = own.most_common(1)[0][0], "its history's own uid"
            else:
                new_uid_, how = new_uid(), "a new uid (its history's lines rewritten to it)"
                rewrite_uid(entry.folder, uid, new_uid_)
            claimed.add(new_uid_)
            entry.doc["uid"] = new_uid_
            entry.history = read_history(entry.folder / HISTORY_FILE, new_uid_)
            notes.setdefault(id(entry), []).append(
                f"its run.json carried the uid {uid[:12]} of run {genuine.doc['id']} ({genuine.folder.name});"
                f" indexed under {how} {new_uid_[:12]}"
            )
    ids = {e.doc["id"] for e in entries}
    numbers = {n for e in entries if (n := folder_number(e.folder)) is not None}
    used: set[int] = set()
    for entry in sorted(entries, key=lambda e: (folder_number(e.folder) != e.doc["id"], entries.index(e))):
        run_id = entry.doc["id"]
        if run_id in used:
            number = folder_number(entry.folder)
            free = number is not None and number not in ids
            entry.doc["id"] = number if free else max(ids | numbers) + 1
            ids.add(entry.doc["id"])
            notes.setdefault(id(entry), []).append(
                f"its id {run_id} is another run's; indexed as run {entry.doc['id']}"
            )
        used.add(entry.doc["id"])
    for entry in entries:
        if id(entry) in notes:
            write_run_file(entry.folder, entry.doc)
            report.rebuilt.append(
                f"{entry.folder.name}: {'; '.join(notes[id(entry)])}; its run.json rewritten"
            )


def _lines_of(entry: _Entry, uid: str) -> int:
    return sum(1 for r in entry.history.records if r.get("uid") == uid)


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
    row.update(config=json.dumps(doc.get("config") or {}), run_dir=stored_dir(store.runs_root, folder))
    row["status"] = row["status"] if row.get("status") in STATUSES else "failed"
    row["cancel_requested"] = int(bool(row.get("cancel_requested")))
    row["created_at"] = row.get("created_at") or 0.0
    row["name"] = row.get("name") or folder.name
    metrics: dict[tuple[int, str], float | None] = {}
    probes: dict[tuple, list] = {}
    samples: dict[str, list] = {}
    votes: dict[tuple, list] = {}  # (step, group_index, voter) → sample, choice, created_at; never truncated
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
        elif kind == "vote" and isinstance(rec.get("row"), list) and len(rec["row"]) == 5:
            group_index, voter, sample, choice, created_at = rec["row"]
            votes.setdefault((step, group_index, voter), [sample, choice, created_at])
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
        store.db.conn.executemany(
            "INSERT INTO votes (run_id, step, group_index, voter, sample, choice, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, *k, *v) for k, v in votes.items()],
        )
        store._refill_latest(run_id)
        store.db.execute(
            "UPDATE runs SET last_step = (SELECT MAX(step) FROM metrics WHERE run_id = ?) WHERE id = ?",
            [run_id, run_id],
        )
    return len(metrics)
