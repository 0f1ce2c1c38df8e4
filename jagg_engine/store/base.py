"""What every part of the run store shares: file names, statuses, errors, uids, and the runs root's folders.

A runs root holds ``jagg.db`` (the index, :mod:`.index`) and one ``run-NNNN`` folder per run, holding its
``run.json`` and ``history.jsonl`` (:mod:`.history`). Nothing here opens the database or takes a lock.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from pathlib import Path

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
BUSY_TIMEOUT_S = 30.0  # SQLite's busy timeout: how long one statement waits on another process's lock
LOG_TAIL_LINES = 20
RUN_FILE_FORMAT = 1


class StoreError(ValueError):
    """A request the store refuses (unknown run, forbidden status change); the message is one line."""


class CorruptIndexError(StoreError):
    """``jagg.db`` cannot be used (corrupt, not a database, a directory); one line naming the file and
    ``jagg reindex``."""


class ClaimError(StoreError):
    """Another trainer or launcher has this run; the refused one leaves the run's status alone."""


def new_uid() -> str:
    """A new run uid: 32 hex digits."""
    return uuid.uuid4().hex


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def folder_uid(folder: Path) -> str | None:
    """The uid in ``folder/run.json`` (None when it has none or cannot be read)."""
    try:
        doc = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("uid") if isinstance(doc, dict) and isinstance(doc.get("uid"), str) else None


def folder_number(folder: Path) -> int | None:
    """N of a ``run-NNNN`` folder's name (None for any other name)."""
    match = RUN_FOLDER.match(folder.name)
    return int(match.group(1)) if match else None


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


def stored_dir(root: Path, run_dir: str | os.PathLike[str] | None) -> str | None:
    """How ``runs.run_dir`` keeps a folder: relative to the runs ``root`` when it lies inside it (so a copied
    or moved runs folder finds its run folders in itself), else absolute."""
    if run_dir is None:
        return None
    folder = Path(run_dir)
    folder = (folder if folder.is_absolute() else Path.cwd() / folder).resolve()
    root = root.resolve()
    if folder != root and folder.is_relative_to(root):
        return folder.relative_to(root).as_posix()
    return str(folder)


def resolve_dir(root: Path, stored: str | None, uid: str | None) -> str | None:
    """The absolute folder of a ``runs.run_dir`` value: a relative one lies in the runs ``root``. An absolute
    one outside the root, written by a version that kept absolute paths, is taken as the root's folder of
    the same ``run-NNNN`` name when that folder's ``run.json`` carries the run's uid (the runs folder was
    copied or moved): a copy never writes into its original."""
    if not stored:
        return None
    root = root.resolve()
    folder = Path(stored)
    if not folder.is_absolute():
        return str(root / folder)
    if folder.is_relative_to(root) or not RUN_FOLDER.match(folder.name):
        return stored
    here = root / folder.name
    if uid and folder_uid(here) == uid:
        return str(here)
    return stored


def owned_folder(root: Path, run_dir: str | None) -> Path | None:
    """``run_dir`` if it is a real folder strictly inside the runs ``root``, else None."""
    if not run_dir:
        return None
    folder = Path(run_dir)
    if not folder.is_absolute():
        folder = Path.cwd() / folder
    if folder.is_symlink() or not folder.is_dir():
        return None
    root = root.resolve()
    resolved = folder.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        return None
    return resolved


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


def slug(name: str) -> str:
    """A run name as a file-name part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "run"


def storage_refusal(exc: BaseException) -> bool:
    """An error that means "this storage takes no writes now" (read-only, full, no permission)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)
    text = str(exc).lower()
    return any(
        s in text for s in ("readonly", "read-only", "disk is full", "unable to open", "disk i/o error")
    )
