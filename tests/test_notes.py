"""Run notes (``<runs_dir>/notes.json``) under real faults: a file torn in half, two processes saving at once,
a folder that cannot be written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app import notes

REPO = Path(__file__).resolve().parents[1]


def test_a_torn_notes_file_is_kept_aside_and_its_readable_notes_carried_over(tmp_path):
    for run_id in range(1, 9):
        notes.set_note(tmp_path, run_id, f'note of run {run_id}, with "quotes" and a comma')
    path = tmp_path / notes.NOTES_NAME
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a torn write: the first half only
    torn = path.read_bytes()

    read = notes.load_notes(tmp_path)
    assert read.damage is not None and read.damage.startswith("notes.json does not parse")
    kept = read.notes
    assert 1 <= len(kept) < 8 and kept == {i: f'note of run {i}, with "quotes" and a comma' for i in kept}
    assert notes.read_notes(tmp_path) == kept  # History shows what can still be read
    assert path.read_bytes() == torn  # reading changes nothing

    saved = notes.set_note(tmp_path, 20, "after the tear")
    aside = sorted(tmp_path.glob("notes.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == torn  # the damaged file, byte for byte
    assert saved.message == (
        f"{read.damage}: kept aside as {aside[0].name}; {len(kept)} note(s) read from it are carried over"
    )
    assert "\n" not in saved.message
    assert notes.load_notes(tmp_path) == (({**kept, 20: "after the tear"}), None)
    again = notes.set_note(tmp_path, 21, "and one more")
    assert again.message is None and len(list(tmp_path.glob("notes.json.damaged-*"))) == 1


@pytest.mark.parametrize(
    "content, damage",
    [
        (b"[1, 2]", "notes.json does not parse (a JSON list, not a mapping)"),
        (b'{"one": "x"}', "notes.json does not parse"),
        (b'{"3": "caf\xe9"}', "notes.json is not UTF-8 (byte at offset 10)"),
        (b"", "notes.json does not parse"),
    ],
)
def test_any_damaged_notes_file_is_never_overwritten(tmp_path, content, damage):
    (tmp_path / notes.NOTES_NAME).write_bytes(content)
    assert notes.set_note(tmp_path, 99, "") == ({3: "caf\ufffd"} if b"caf" in content else {}, None)
    assert (
        tmp_path / notes.NOTES_NAME
    ).read_bytes() == content  # removing no note (a deleted run) writes nothing
    saved = notes.set_note(tmp_path, 1, "kept")
    aside = list(tmp_path.glob("notes.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert saved.message.startswith(damage) and aside[0].name in saved.message
    assert notes.read_notes(tmp_path)[1] == "kept"


def test_a_damaged_file_is_kept_aside_by_the_apps_save_note_with_one_line(tmp_path):
    from app import ui
    from jagg_engine.store import open_store
    from jagg_engine.train.config import TrainConfig

    root = tmp_path / "runs"
    store = open_store(root)
    run_id = store.create_run("a", TrainConfig().to_dict(), None)
    store.close()
    (root / notes.NOTES_NAME).write_text('{\n "1": "the first note",\n "2": "cut he')
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        history = demo.jagg_handlers.history
        message, _ = history.save_note(run_id, "a note after the tear")
    finally:
        demo.jagg_manager.shutdown()
    aside = list(root.glob("notes.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_text().endswith("cut he")
    assert message.startswith(f"Note of run #{run_id} saved. notes.json does not parse")
    assert f"kept aside as {aside[0].name}; 1 note(s) read from it are carried over" in message
    assert "\n" not in message
    assert notes.read_notes(root) == {1: "a note after the tear"}  # run 1's note now, the old one aside


SAVER = textwrap.dedent(
    """
    import sys, time
    from app import notes
    folder, first, count, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    while time.time() < start:  # both processes start saving at the same instant
        pass
    for run_id in range(first, first + count):
        try:
            notes.set_note(folder, run_id, f"note {run_id}")
            print("saved", run_id, flush=True)
        except Exception as exc:
            print("error", run_id, type(exc).__name__, exc, flush=True)
    """
)


def test_two_processes_saving_at_once_keep_every_note_answered_saved(tmp_path):
    start = time.time() + 3.0  # after both interpreters have imported the module
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAVER, str(tmp_path), str(first), "150", str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for first in (1, 1001)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    lines = [line.split() for out, _ in outputs for line in out.splitlines()]
    assert not [line for line in lines if line[0] != "saved"]  # no save raised
    saved = {int(line[1]) for line in lines}
    assert saved == set(range(1, 151)) | set(range(1001, 1151))
    kept = notes.load_notes(tmp_path)
    assert kept.damage is None and set(kept.notes) == saved  # every note answered "saved" is kept
    assert all(kept.notes[i] == f"note {i}" for i in saved)
    assert not list(tmp_path.glob(".notes.json.*.tmp"))  # no temporary file left behind
    json.loads((tmp_path / notes.NOTES_NAME).read_text())


def test_a_read_only_folder_is_one_line_not_an_exception(tmp_path):
    """A read-only bind mount of the runs folder (root ignores chmod)."""
    source, view = tmp_path / "runs", tmp_path / "view"
    source.mkdir()
    view.mkdir()
    notes.set_note(source, 1, "kept")
    for args in (["--bind", str(source), str(view)], ["-o", "remount,bind,ro", str(view)]):
        proc = subprocess.run(["mount", *args], capture_output=True, text=True)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", str(view)], check=False)
            pytest.skip(f"mount is not permitted here: {proc.stderr.strip()}")
    try:
        with pytest.raises(notes.NoteError, match=r"^note: cannot be saved: .*: Read-only file system$"):
            notes.set_note(view, 2, "refused")
        assert notes.read_notes(view) == {1: "kept"}  # reading needs no write
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
    assert notes.read_notes(source) == {1: "kept"}
