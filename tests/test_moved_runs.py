"""A runs folder that can be copied or moved, and a run that cannot be deleted from under its trainer. Real
faults: `cp -a runs copy` with the original then mounted read-only (root ignores chmod), a `mv` of the folder,
an index of an older version that kept absolute paths, and Delete pressed in a second session while a resume
trains. The README's "What happens when…" table names these tests."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for
from toy import ENV, jagg, toy

from app.runs import RunManager
from jagg_engine.store import DB_NAME, RunLock, StoreError, open_store, pid_alive

TOY = toy()


STEPS = 30  # a toy step takes milliseconds: enough of them that the cancel lands before the last


def cancelled_run(root: Path, steps: int = STEPS, at: int = 2) -> None:
    """Run 1 of ``root``: `jagg train` of ``steps`` steps, cancelled once it has logged step ``at``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jagg_engine.cli", "train", *TOY, f"steps={steps}", "--runs-dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    with open_store(root) as store:
        logged = lambda: store.get_run(1) and (store.get_run(1)["last_step"] or 0) >= at  # noqa: E731
        assert wait_for(logged, every=0.005)
        store.request_cancel(1)
        assert proc.wait(timeout=300) == 0
        assert store.get_run(1)["status"] == "cancelled"


def fingerprint(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry under ``root``: (size, mtime in ns, sha256) of files; folders by their mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path.relative_to(root))] = (st.st_size if path.is_file() else 0, st.st_mtime_ns, digest)
    return out


def absolute_paths(db: Path, folder_root: Path) -> None:
    """Make ``db`` an index as an older version wrote it: each run's folder as an absolute path under
    ``folder_root``."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE runs SET run_dir = ? || '/' || run_dir", [str(folder_root)])
    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("index", ["relative", "absolute"], ids=["this-version", "older-absolute-index"])
def test_a_copied_runs_folder_resumes_in_place_while_the_original_is_read_only(tmp_path, index):
    """`cp -a runs copy`, the original mounted read-only, then `jagg train --resume 1 --runs-dir copy`: the
    resume finishes in the copy, every file of the original is as it was (size, mtime, sha256)."""
    runs, copy = tmp_path / "runs", tmp_path / "copy"
    cancelled_run(runs)
    if index == "absolute":  # an index written by a version that kept absolute paths (the one the issue met)
        absolute_paths(runs / DB_NAME, runs.resolve())
    assert subprocess.run(["cp", "-a", str(runs), str(copy)]).returncode == 0
    before = fingerprint(runs)
    mount = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(runs), str(runs)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"mount is not permitted here: {mount.stderr.strip()}")
    try:
        assert not os.access(runs, os.W_OK) or subprocess.run(["touch", str(runs / "probe")]).returncode != 0
        done = jagg("train", "--resume", "1", "--runs-dir", str(copy))
        assert done.returncode == 0, done.stderr[-3000:]
        listed = jagg("runs", "--runs-dir", str(copy))
        assert listed.returncode == 0 and "finished" in listed.stdout, listed.stdout + listed.stderr
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)
    assert fingerprint(runs) == before  # nothing of the original was written, not even a lock's pid file
    with open_store(copy) as store:
        run = store.get_run(1)
        assert run["status"] == "finished" and Path(run["run_dir"]) == copy.resolve() / "run-0001"
        assert store.metrics_frame(1)["step"].tolist() == list(range(1, STEPS + 1))
        (stored,) = store.db.execute("SELECT run_dir FROM runs WHERE id = 1").fetchone()
        assert stored == "run-0001"  # kept relative: the copy can be copied again
    assert (copy / "run-0001" / "checkpoints" / f"step_{STEPS:05d}").is_dir()
    assert "resuming after step" in (copy / "run-0001" / "train.log").read_text()


@pytest.mark.slow
def test_a_moved_runs_folder_resumes_in_place_and_never_recreates_the_old_one(tmp_path):
    """`mv runs moved` (an older, absolute index): the run resumes in ``moved``; ``runs`` is not made again;
    `jagg export` and the run list read the moved folder's files."""
    runs, moved = tmp_path / "runs", tmp_path / "disk2" / "moved"
    cancelled_run(runs)
    absolute_paths(runs / DB_NAME, runs.resolve())
    moved.parent.mkdir()
    os.rename(runs, moved)
    done = jagg("train", "--resume", "1", "--runs-dir", str(moved))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not runs.exists()
    with open_store(moved) as store:
        assert store.get_run(1)["status"] == "finished"
        assert store.get_run(1)["run_dir"] == str(moved.resolve() / "run-0001")
    out = jagg("export", "1", "--runs-dir", str(moved), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert not runs.exists()


def test_an_index_whose_folders_are_elsewhere_is_refused_in_one_line(tmp_path):
    """Only `jagg.db` copied (its run folders left behind): a resume is one line naming `jagg reindex`, and
    nothing is written where the index points."""
    runs, lone = tmp_path / "runs", tmp_path / "lone"
    with open_store(runs) as store:
        run_id, folder = store.create_run_folder("r", {"backbone": "linear-toy"}, launcher="cli")
        store.set_status(run_id, "failed", error="test")
    absolute_paths(runs / DB_NAME, runs.resolve())
    lone.mkdir()
    (lone / DB_NAME).write_bytes((runs / DB_NAME).read_bytes())
    before = fingerprint(runs)
    proc = jagg("train", "--resume", str(run_id), "--runs-dir", str(lone))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"run {run_id}: its folder {folder} is not inside the runs folder {lone.resolve()}" in lines[0]
    assert f"`jagg reindex --runs-dir {lone.resolve()}`" in lines[0]
    assert fingerprint(runs) == before


@pytest.mark.slow
def test_delete_during_a_resume_from_a_second_session_is_refused_and_no_trainer_outlives_its_row(tmp_path):
    """Session A resumes run 1; session B (same app) presses Delete while the trainer starts, and a second
    app on the folder presses it while the trainer trains: each is refused in one line; the run finishes
    with every step; once its trainer has exited, the delete goes through."""
    cancelled_run(tmp_path, steps=40, at=2)
    app = RunManager(tmp_path, max_concurrent=1)
    other = RunManager(tmp_path, max_concurrent=1)  # a second app process on the same runs folder
    assert "resuming" in app.resume(1)
    pid = app._children[1].pid
    with pytest.raises(StoreError, match=rf"^run 1: is resuming \(pid {pid}\); cancel it first$"):
        app.delete(1, delete_files=True)  # B, while A's trainer starts
    assert wait_for(lambda: RunLock.held_elsewhere(tmp_path / "run-0001"))
    with pytest.raises(
        StoreError,
        match=r"^run 1: (a trainer holds its folder \(pid \d+\)|is running \(pid \d+\));"
        r" cancel it first$",
    ):
        other.delete(1, delete_files=True)
    assert wait_for(lambda: app.store.get_run(1)["status"] == "running")
    with pytest.raises(StoreError, match=r"^run 1: is running \(pid \d+\); cancel it first$"):
        other.store.delete_run(1, delete_files=True)
    assert app.store.get_run(1) is not None and (tmp_path / "run-0001").is_dir()
    assert wait_for(lambda: app.store.get_run(1)["status"] == "finished"), app.store.get_run(1)
    assert app.store.metrics_frame(1)["step"].tolist() == list(range(1, 41))
    trainer = app.store.get_run(1)["pid"]
    assert wait_for(lambda: app._children[1].poll() is not None)
    assert app.delete(1, delete_files=True) is True
    assert app.store.get_run(1) is None and not (tmp_path / "run-0001").exists()
    assert not pid_alive(trainer)


def test_a_trainer_holding_the_lock_blocks_delete_and_a_launcher_finds_a_deleted_run_gone(tmp_path):
    """The store's own refusal (no app): a process holding the run folder's lock makes delete one line;
    `jagg train --resume` of a run deleted before it took the lock is one line and leaves no folder."""
    with open_store(tmp_path) as store:
        run_id, folder = store.create_run_folder("r", {"backbone": "linear-toy"}, launcher="cli")
        store.set_status(run_id, "failed", error="test")
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY);"
                " fcntl.flock(fd, fcntl.LOCK_EX); open(os.path.join(sys.argv[1], '.trainer.pid'), 'w')"
                ".write(str(os.getpid())); print('held', flush=True); time.sleep(60)",
                str(folder),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(
                StoreError,
                match=rf"^run {run_id}: a trainer holds its folder \(pid {holder.pid}\); cancel it first$",
            ):
                store.delete_run(run_id, delete_files=True)
            assert store.get_run(run_id) is not None and folder.is_dir()
        finally:
            holder.kill()
            holder.wait()
        assert store.delete_run(run_id, delete_files=True) is True
    proc = jagg("train", "--resume", str(run_id), "--runs-dir", str(tmp_path))
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == f"jagg train: error: run id: no run {run_id} in {tmp_path}"
    )
    assert not folder.exists()
