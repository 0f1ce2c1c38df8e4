"""A note per run, written in the History tab: ``<runs_dir>/notes.json`` (run id → text), beside the run
history, never inside it (the trainer never reads or writes notes). Each save rewrites the file atomically.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

NOTES_NAME = "notes.json"
MAX_NOTE_CHARS = 2000
_LOCK = threading.Lock()


class NoteError(ValueError):
    """A note that cannot be kept (too long, not text); one line."""


def read_notes(runs_dir: str | os.PathLike[str]) -> dict[int, str]:
    """Every run's note; {} when there is none or the file does not parse (notes are never worth a crash)."""
    try:
        raw = json.loads((Path(runs_dir) / NOTES_NAME).read_text(encoding="utf-8"))
        return {int(k): str(v) for k, v in raw.items() if str(v).strip()}
    except (OSError, ValueError, AttributeError):
        return {}


def set_note(runs_dir: str | os.PathLike[str], run_id: int, text: str) -> dict[int, str]:
    """Keep ``text`` as run ``run_id``'s note (empty text removes it); returns every note."""
    if not isinstance(text, str):
        raise NoteError(f"note: must be text, got {text!r}")
    if len(text) > MAX_NOTE_CHARS:
        raise NoteError(f"note: at most {MAX_NOTE_CHARS} characters, got {len(text)}")
    path = Path(runs_dir) / NOTES_NAME
    with _LOCK:
        notes = read_notes(runs_dir)
        if text.strip():
            notes[int(run_id)] = text.strip()
        else:
            notes.pop(int(run_id), None)
        tmp = path.with_name(f".{NOTES_NAME}.tmp")
        tmp.write_text(json.dumps({str(k): v for k, v in sorted(notes.items())}, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    return notes
