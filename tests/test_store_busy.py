"""The store never answers "database is locked": another process holding SQLite's write lock makes a store write
wait (the busy timeout, then retries with backoff) and succeed; past the whole wait the refusal is one line.

The lock is held by a real second connection in a second process (``BEGIN IMMEDIATE`` and a write, kept open
for about a second), as the trainer, the app and ``jagg runs`` hold it on one runs folder.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jagg_engine.store import RunStore, StoreError, open_store, sqlite

HOLDER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE runs SET name = 'held' WHERE id = 1")
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextmanager
def write_lock_held(db: Path, seconds: float) -> Iterator[subprocess.Popen]:
    """Another process holds ``db``'s write lock for ``seconds`` from the moment this yields."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "holding"
        yield proc
    finally:
        proc.wait(timeout=60)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with open_store(tmp_path / "runs") as s:
        run_id, _ = s.create_run_folder("mine", {"name": "mine"})
        s.set_status(run_id, "running", pid=None)
        yield s


WRITES = {
    "log_step": lambda s: s.log_step(1, 0, {"reward/mean": 0.5}),
    "request_cancel": lambda s: s.request_cancel(1),
    "create_run_folder": lambda s: s.create_run_folder("second", {"name": "second"}),
    "set_status": lambda s: s.set_status(1, "finished"),
}


@pytest.mark.parametrize("write", WRITES, ids=list(WRITES))
def test_a_write_waits_for_another_process_and_succeeds(store: RunStore, write: str) -> None:
    with write_lock_held(store.path, 1.0) as holder:
        WRITES[write](store)
        assert holder.poll() is not None or holder.wait(timeout=60) == 0  # the holder committed first
    run = store.get_run(1)
    assert run["name"] == "held"  # the other process's write is kept, and so is ours:
    if write == "log_step":
        assert store.metrics_frame(1)["reward/mean"].tolist() == [0.5]
    elif write == "request_cancel":
        assert store.cancel_requested(1)
    elif write == "create_run_folder":
        assert [r["name"] for r in store.list_runs()] == ["second", "held"]
    else:
        assert run["status"] == "finished"


def test_a_busy_answer_is_tried_again_with_backoff(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a busy timeout far shorter than the other process's write, SQLite answers "database is locked":
    the store tries again until the lock is free instead of passing that on."""
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT_S", 0.05)
    with open_store(store.runs_root) as short:
        assert short.db.execute("PRAGMA busy_timeout").fetchone()[0] == 50
        with write_lock_held(store.path, 1.0):
            short.log_step(1, 3, {"reward/mean": 1.5})
            short.request_cancel(1)
    assert store.metrics_frame(1)["step"].tolist() == [3] and store.cancel_requested(1)


def test_a_lock_held_past_the_whole_wait_is_one_store_line(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(sqlite, "WRITE_WAIT_S", 0.3)
    with open_store(store.runs_root) as short, write_lock_held(store.path, 5.0) as holder:
        with pytest.raises(StoreError, match="held its write lock for over") as caught:
            short.request_cancel(1)
        assert holder.poll() is None  # refused at the store's deadline, while the other process holds it
    assert "database is locked" not in str(caught.value) and not store.cancel_requested(1)


def test_every_connection_of_the_store_waits_on_a_busy_database(store: RunStore) -> None:
    assert (
        store.db.execute("PRAGMA busy_timeout").fetchone()[0] == int(sqlite.BUSY_TIMEOUT_S * 1000) >= 30_000
    )
