"""A note per run, written in the History tab: :mod:`jagg_engine.store.notes` (``<runs_dir>/notes.json``),
kept in the engine so that ``jagg report`` shows the notes as History does."""

from jagg_engine.store.notes import (  # noqa: F401 (the app's names for them)
    LOCK_NAME,
    MAX_NOTE_CHARS,
    NOTES_NAME,
    NoteError,
    Notes,
    Saved,
    load_notes,
    notes_lock,
    read_notes,
    set_note,
)
