"""A note per run, written in the History tab: ``<runs_dir>/notes.json`` (run id → text), beside the run
history, never inside it (the trainer never reads or writes notes). The app writes them (:mod:`app.notes`
is this module) and shows them in History; the report (:mod:`jagg_engine.report.page`) shows them too.

Kept like run data: every save reads, changes and rewrites the file under an exclusive ``fcntl.flock`` on
``<runs_dir>/.notes.lock``, which every app (and every thread) on the folder takes, so two apps saving at once
both keep their note; the file is written to a temporary file of its own, fsynced and renamed over
``notes.json`` (``os.replace``), so a reader never sees half a file. A damaged ``notes.json`` (cut short by a
crash of an older version, a bad copy, a full disk elsewhere) is never overwritten: the next save renames it
to ``notes.json.damaged-<UTC time>``, carries over every note it can still read in it, and says so in one
line. Reading never changes the folder (it works on a read-only one).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

NOTES_NAME = "notes.json"
LOCK_NAME = ".notes.lock"
MAX_NOTE_CHARS = 2000
# One "id": "text" pair as json.dumps writes it; a damaged file is read pair by pair with it.
_PAIR = re.compile(r'"(\d{1,19})"\s*:\s*("(?:[^"\\]|\\.)*")')


class NoteError(ValueError):
    """A note that cannot be kept (too long, not text, a folder that cannot be written); one line."""


class Notes(NamedTuple):
    """The notes of a folder as read: run id → text, and why the file is damaged (None when it is sound)."""

    notes: dict[int, str]
    damage: str | None


class Saved(NamedTuple):
    """What a save did: every note now kept, and the one-line message when a damaged file was kept aside."""

    notes: dict[int, str]
    message: str | None


def _parse(text: str) -> Notes:
    """``notes.json``'s text → its notes. Text that is not a JSON mapping of ids to strings is damaged: the
    notes are the ``"id": "text"`` pairs that can still be read in it (a file cut short keeps the ones
    before the cut)."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not a mapping")
        return Notes({int(k): str(v) for k, v in raw.items() if str(v).strip()}, None)
    except (ValueError, TypeError, RecursionError) as exc:
        salvaged: dict[int, str] = {}
        for key, value in _PAIR.findall(text):
            with contextlib.suppress(ValueError):
                note = json.loads(value)
                if note.strip():
                    salvaged[int(key)] = note
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Notes(salvaged, f"{NOTES_NAME} does not parse ({reason})")


def load_notes(runs_dir: str | os.PathLike[str]) -> Notes:
    """Every run's note and whether the file is damaged ({} and None when there is no file)."""
    path = Path(runs_dir) / NOTES_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Notes({}, None)
    except OSError as exc:
        return Notes({}, f"{NOTES_NAME}: cannot be read ({exc.strerror or exc})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        parsed = _parse(text)
        return Notes(parsed.notes, f"{NOTES_NAME} is not UTF-8 (byte at offset {exc.start})")
    return _parse(text)


def read_notes(runs_dir: str | os.PathLike[str]) -> dict[int, str]:
    """Every run's note (from a damaged file: the notes still readable in it); never raises."""
    return load_notes(runs_dir).notes


@contextlib.contextmanager
def notes_lock(runs_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the folder's notes lock (``fcntl.flock`` on ``.notes.lock``): one writer at a time across every
    app, process and thread on the folder."""
    path = Path(runs_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise NoteError(f"note: cannot be saved: {runs_dir}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write(path: Path, notes: dict[int, str]) -> None:
    """Write ``notes`` to ``path`` atomically: a temporary file of this writer, fsynced, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{NOTES_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({str(k): v for k, v in sorted(notes.items())}, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash once the folder is synced
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _keep_aside(path: Path) -> Path:
    """Rename a damaged notes file to ``notes.json.damaged-<UTC time>`` (a free name); return the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{NOTES_NAME}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{NOTES_NAME}.damaged-{stamp}-{n}")
    os.replace(path, aside)
    return aside


def set_note(runs_dir: str | os.PathLike[str], run_id: int, text: str) -> Saved:
    """Keep ``text`` as run ``run_id``'s note (empty text removes it), under the folder's notes lock; return
    every note and, when ``notes.json`` was damaged, the line saying where it was kept aside."""
    if not isinstance(text, str):
        raise NoteError(f"note: must be text, got {text!r}")
    if len(text) > MAX_NOTE_CHARS:
        raise NoteError(f"note: at most {MAX_NOTE_CHARS} characters, got {len(text)}")
    path = Path(runs_dir) / NOTES_NAME
    with notes_lock(runs_dir):
        notes, damage = load_notes(runs_dir)
        if not text.strip() and int(run_id) not in notes:
            return Saved(notes, None)  # nothing to remove: the file is left as it is, damaged or not
        message = None
        try:
            if damage is not None:
                aside = _keep_aside(path)
                message = f"{damage}: kept aside as {aside.name}; {len(notes)} note(s) read from it are carried over"
            if text.strip():
                notes[int(run_id)] = text.strip()
            else:
                notes.pop(int(run_id), None)
            _write(path, notes)
        except OSError as exc:
            raise NoteError(f"note: cannot be saved: {runs_dir}: {exc.strerror or exc}") from None
    return Saved(notes, message)
