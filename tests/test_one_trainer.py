"""One trainer per run, with real processes: two `jagg train --resume N` at once, Resume pressed twice in one
app, and three app processes racing over 50 queued runs of one runs folder. The README's "What happens
when…" table names these tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_for
from toy import ENV, toy

from app.runs import RunManager
from jagg_engine.store import ClaimError, RunLock, StoreError, open_store

TOY = toy()


def jagg_train(*args: str, runs_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jagg_engine.cli", "train", *args, "--runs-dir", str(runs_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
    )


def last_step(store, run_id: int) -> int:
    return store.get_run(run_id)["last_step"] or 0


def cancel_at(store, run_id: int, step: int) -> None:
    """Ask the run to stop once it has logged ``step``; wait until it is cancelled."""
    assert wait_for(lambda: last_step(store, run_id) >= step or store.get_run(run_id)["status"] != "running")
    store.request_cancel(run_id)
    assert wait_for(lambda: store.get_run(run_id)["status"] == "cancelled"), store.get_run(run_id)


@pytest.mark.slow
def test_two_resumes_at_once_and_resume_pressed_twice_one_trains_the_run_ends_finished(tmp_path):
    first = jagg_train(*TOY, "steps=60", runs_dir=tmp_path)
    store = open_store(tmp_path)
    assert wait_for(lambda: store.list_runs() and store.list_runs()[0]["status"] == "running")
    cancel_at(store, 1, 2)
    assert first.wait(timeout=120) == 0

    # Two `jagg train --resume 1` started together: one trains, the other is refused while it does.
    a, b = (jagg_train("--resume", "1", runs_dir=tmp_path) for _ in range(2))
    assert wait_for(lambda: a.poll() is not None or b.poll() is not None)
    loser, winner = (a, b) if a.poll() is not None else (b, a)
    assert winner.poll() is None  # the winner is still training when the loser is refused
    message = loser.stderr.read()
    lines = message.strip().splitlines()
    assert loser.returncode == 2 and len(lines) == 1 and "Traceback" not in message, message
    # refused by the folder's lock, or, where the winner had already marked the run running before the
    # loser read it (a busy machine), by the run's status: either way one line, and the run is not started twice
    assert (
        lines[0].startswith("jagg train: error: run 1: another trainer holds ")
        and "; not started" in lines[0]
    ) or lines[0] == "jagg train: error: run 1: status is running; allowed: failed, cancelled", lines[0]
    # the winner takes the folder's lock first and marks the run running just after: wait for the mark
    assert wait_for(lambda: store.get_run(1)["status"] == "running"), store.get_run(1)
    assert store.get_run(1)["pid"] == winner.pid
    cancel_at(store, 1, 30)  # the winner stops after step 30 or so, with a checkpoint
    assert winner.wait(timeout=120) == 0

    # The same in the app: Resume pressed twice (the second press while the first trainer starts).
    manager = RunManager(tmp_path, max_concurrent=2)
    assert "resuming" in manager.resume(1)
    with pytest.raises(ClaimError, match=r"^run 1: already resuming \(pid \d+\); not started again$"):
        manager.resume(1)
    assert len(manager._children) == 1
    # A second app on the folder, once the trainer holds the run: refused too, and the status is untouched.
    other = RunManager(tmp_path, max_concurrent=2)
    assert wait_for(
        lambda: RunLock.held_elsewhere(tmp_path / "run-0001") or store.get_run(1)["status"] != "cancelled"
    )
    with pytest.raises(StoreError, match=r"^run 1: (another trainer holds its folder|is running)"):
        other.resume(1)
    assert wait_for(lambda: store.get_run(1)["status"] == "finished"), store.get_run(1)
    assert store.get_run(1)["error"] is None
    frame = store.metrics_frame(1)
    assert frame["step"].tolist() == list(range(1, 61))  # every step once: no gap, no duplicate


APP = """
import sys, time
from pathlib import Path
from app.runs import RunManager
root = Path(sys.argv[1])
fake = [sys.executable, "-c", sys.argv[2]]
manager = RunManager(root, command=lambda run_id, runs_dir: [*fake, str(run_id), str(runs_dir)], max_concurrent=50)
while not (root / "go").exists():
    time.sleep(0.01)
idle = 0
while idle < 20:
    started = manager.tick()
    idle = 0 if started or manager.pending() else idle + 1
    time.sleep(0.05)
"""

# A trainer stand-in (stdlib only, so 50 of them start fast): it records that it started, then claims the run
# from queued as the trainer does (a compare-and-set of the status) and finishes it.
FAKE_TRAINER = """
import os, sqlite3, sys, time
run_id, root = int(sys.argv[1]), sys.argv[2]
with open(os.path.join(root, "starts.log"), "a") as fh:
    fh.write(f"{run_id} {os.getpid()}\\n")
db = sqlite3.connect(os.path.join(root, "jagg.db"), timeout=30)
with db:
    db.execute("UPDATE runs SET status = 'running', pid = ?, pid_at = ? WHERE id = ? AND status = 'queued'",
               [os.getpid(), time.time(), run_id])
time.sleep(0.2)
with db:
    db.execute("UPDATE runs SET status = 'finished', finished_at = ? WHERE id = ? AND status = 'running'",
               [time.time(), run_id])
"""


def test_three_apps_on_one_runs_folder_start_each_of_50_queued_runs_once(tmp_path):
    queue = RunManager(tmp_path)
    ids = [queue.create({"name": f"r{i}", "processes": 1}) for i in range(50)]
    queue.shutdown()
    apps = [
        subprocess.Popen(
            [sys.executable, "-c", APP, str(tmp_path), FAKE_TRAINER], env=ENV, start_new_session=True
        )
        for _ in range(3)
    ]
    time.sleep(3)  # all three are ticking-ready (imports done) before the queue opens
    (tmp_path / "go").touch()
    for app in apps:
        assert app.wait(timeout=300) == 0
    store = open_store(tmp_path)
    assert wait_for(lambda: all(store.get_run(i)["status"] == "finished" for i in ids), timeout=60)
    starts = [int(line.split()[0]) for line in (tmp_path / "starts.log").read_text().splitlines()]
    assert sorted(starts) == ids  # every run started exactly once: 0 double starts


CANCELLED_AT_ONCE = """
import os, sys, time
from jagg_engine.store import open_store
run_id, runs_dir = int(sys.argv[1]), sys.argv[2]
store = open_store(runs_dir)
store.set_status(run_id, "running", pid=os.getpid())
store.set_status(run_id, "cancelled")
# a trainer's exit takes a while after its final status (a busy machine): this one exits when the test says so
for _ in range(1200):
    if os.path.exists(os.path.join(runs_dir, "exit")):
        break
    time.sleep(0.1)
"""


def taken_over_and_cancelled(run: dict, pid: int) -> bool:
    return run["pid"] == pid and run["status"] == "cancelled"


def test_a_resumed_run_cancelled_again_resumes_while_its_last_trainer_is_still_exiting(tmp_path):
    """A resumed trainer that took the run over (its pid recorded) is no longer "starting", even when the run
    was cancelled again before the app looked and the process has not exited yet: the next Resume starts the
    run instead of answering "already resuming"."""
    store = open_store(tmp_path)
    run_id, _ = store.create_run_folder("toy", {}, launcher="app")
    store.set_status(run_id, "running", pid=1)
    store.set_status(run_id, "cancelled")
    fake = [sys.executable, "-c", CANCELLED_AT_ONCE]
    manager = RunManager(
        tmp_path, resume_command=lambda run_id, runs_dir: [*fake, str(run_id), str(runs_dir)]
    )
    assert manager.resume(run_id).startswith(f"run {run_id}: resuming from its last checkpoint")
    first = manager._children[run_id]
    # the fake marks the run running (its pid) and then cancelled: wait for the second mark, not the first
    assert wait_for(lambda: taken_over_and_cancelled(store.get_run(run_id), first.pid))
    assert first.poll() is None  # still exiting
    assert manager.resume(run_id).startswith(f"run {run_id}: resuming from its last checkpoint")
    second = manager._children[run_id]
    assert second.pid != first.pid
    assert wait_for(lambda: store.get_run(run_id)["pid"] == second.pid)
    (tmp_path / "exit").touch()
    for proc in (first, second):
        proc.wait(timeout=60)
