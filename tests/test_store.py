"""RunStore on a temporary database: schema, upserts, status transitions, cancel, liveness, export, WAL."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from jagg_engine import runs_cli
from jagg_engine.store import RunStore, StoreError, open_store, pid_alive

CONFIG = {"backbone": "tiny-shapes", "window": 4, "jagg_frac": 0.6, "strategy": "jagg", "steps": 3}


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    with open_store(tmp_path / "runs") as s:
        yield s


def _run(store: RunStore, name: str = "r", status: str | None = None) -> int:
    run_dir = store.runs_root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = store.create_run(name, CONFIG, run_dir)
    if status == "running":
        store.set_status(run_id, "running", pid=os.getpid())
    return run_id


def test_schema_is_idempotent_and_wal(store: RunStore) -> None:
    run_id = _run(store)
    store.log_step(run_id, 1, {"loss/policy": 0.5})
    schema = store.db.schema
    store.ensure_schema()
    store.ensure_schema()
    with RunStore(store.path) as again:  # a second open of an existing database
        assert again.db.schema == schema
        assert again.get_run(run_id)["name"] == "r"
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    assert set(store.db.table_names()) >= {"runs", "metrics", "probes", "samples"}


def test_create_and_get_run(store: RunStore) -> None:
    run_id = _run(store, "first")
    run = store.get_run(run_id)
    assert run["config"] == CONFIG and run["status"] == "queued"
    assert run["run_dir"] == str((store.runs_root / "first").resolve())
    assert run["cancel_requested"] is False and run["last_step"] is None and run["pid"] is None
    assert store.get_run(run_id + 100) is None
    other = store.create_run("second", CONFIG, None, paired_run_id=run_id)
    assert store.get_run(other)["paired_run_id"] == run_id
    assert [r["id"] for r in store.list_runs()] == [other, run_id]
    with pytest.raises(StoreError, match="no run with id 999"):
        store.create_run("x", CONFIG, None, paired_run_id=999)


def test_log_step_upserts_never_duplicates(store: RunStore) -> None:
    run_id = _run(store, status="running")
    store.log_step(run_id, 1, {"reward/mean": 0.5, "loss/policy": 1.0, "lr": 1e-4})
    store.log_step(run_id, 2, {"reward/mean": 0.6, "loss/policy": float("nan")})
    store.log_step(run_id, 1, {"reward/mean": 0.55, "grad/norm": 2.0})  # a resumed step, logged again
    count = store.db.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", [run_id]).fetchone()[0]
    assert count == 6  # step 1: reward, loss, lr, grad; step 2: reward, loss
    frame = store.metrics_frame(run_id)
    assert list(frame.columns) == ["step", "grad/norm", "loss/policy", "lr", "reward/mean"]
    assert frame["step"].tolist() == [1, 2]
    assert frame["reward/mean"].tolist() == [0.55, 0.6]
    assert frame.loc[0, "loss/policy"] == 1.0 and math.isnan(frame.loc[1, "loss/policy"])  # NaN kept as NaN
    assert math.isnan(frame.loc[1, "grad/norm"])
    assert store.get_run(run_id)["last_step"] == 2  # never lowered by re-logging an earlier step


def test_log_step_accepts_tensors_and_rejects_bad_keys(store: RunStore) -> None:
    torch = pytest.importorskip("torch")
    run_id = _run(store, status="running")
    store.log_step(run_id, 0, {"loss/policy": torch.tensor(0.25)})
    assert store.metrics_frame(run_id)["loss/policy"].tolist() == [0.25]
    with pytest.raises(StoreError, match="metric keys must be non-empty strings"):
        store.log_step(run_id, 1, {"": 1.0})
    with pytest.raises(StoreError, match="no run with id 77"):
        store.log_step(77, 1, {"a": 1.0})
    assert store.db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == 1


def test_metrics_frame_of_a_run_without_metrics(store: RunStore) -> None:
    frame = store.metrics_frame(_run(store))
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["step"] and len(frame) == 0


def test_status_transitions(store: RunStore) -> None:
    run_id = _run(store)
    with pytest.raises(StoreError, match="run .*: cannot go from queued to finished"):
        store.set_status(run_id, "finished")
    store.set_status(run_id, "running", pid=1234)
    run = store.get_run(run_id)
    assert run["status"] == "running" and run["pid"] == 1234 and run["started_at"] is not None
    started = run["started_at"]
    store.set_status(run_id, "failed", error="boom")
    run = store.get_run(run_id)
    assert run["error"] == "boom" and run["finished_at"] >= started
    store.request_cancel(run_id)
    store.set_status(run_id, "running", pid=5678)  # resume: failed → running
    run = store.get_run(run_id)
    assert run["error"] is None and run["finished_at"] is None and run["cancel_requested"] is False
    assert run["started_at"] == started and run["pid"] == 5678
    store.set_status(run_id, "finished")
    for status in ("running", "queued", "failed", "cancelled"):
        with pytest.raises(StoreError, match=f"cannot go from finished to {status} \\(allowed: nothing\\)"):
            store.set_status(run_id, status)
    with pytest.raises(
        StoreError, match="status: must be one of queued, running, finished, failed, cancelled"
    ):
        store.set_status(run_id, "done")
    with pytest.raises(StoreError, match="no run with id"):
        store.set_status(run_id + 1, "running")

    cancelled = _run(store, "c")
    store.set_status(cancelled, "cancelled")  # queued → cancelled
    store.set_status(cancelled, "queued")  # resume through the queue
    assert store.get_run(cancelled)["status"] == "queued"


# Every path through the status table that the trainer (and the app around it) takes.
TRAINER_PATHS = {
    "a run that trains to the end": ["running", "finished"],
    "a run that fails while it trains": ["running", "failed"],
    "a run cancelled while it trains": ["running", "cancelled"],
    "a run that fails while its model loads": ["failed"],
    "an app run cancelled before it started": ["cancelled"],
    "a failed run resumed to the end": ["running", "failed", "running", "finished"],
    "a resume that fails before it runs (e.g. no intact checkpoint)": ["running", "failed", "failed"],
    "a cancelled run whose resume fails before it runs": ["running", "cancelled", "failed"],
    "a cancelled run resumed, then failing": ["running", "cancelled", "running", "failed"],
    "a failed run queued again by the app": ["failed", "queued", "running", "finished"],
    "a cancelled run queued again by the app": ["running", "cancelled", "queued", "running", "finished"],
}


@pytest.mark.parametrize("path", TRAINER_PATHS.values(), ids=TRAINER_PATHS.keys())
def test_every_transition_the_trainer_takes_is_allowed(store: RunStore, path: list[str]) -> None:
    run_id = _run(store)
    for i, status in enumerate(path):
        store.set_status(run_id, status, error=f"error {i}" if status == "failed" else None, pid=os.getpid())
        run = store.get_run(run_id)
        assert run["status"] == status
        if status == "failed":
            assert run["error"] == f"error {i}"  # a resumed run that fails again shows its NEW error


def test_the_transition_table_is_exactly_the_trainers_paths() -> None:
    from jagg_engine.store import STATUSES, TRANSITIONS

    used = {("queued", path[0]) for path in TRAINER_PATHS.values()}
    used |= {(a, b) for path in TRAINER_PATHS.values() for a, b in zip(path, path[1:])}
    allowed = {(a, b) for a in STATUSES for b in TRANSITIONS[a]}
    assert allowed == used  # nothing allowed that no path takes, nothing taken that is refused


def test_runs_record_who_launches_them(store: RunStore) -> None:
    app_run = store.create_run("a", CONFIG, None, launcher="app")
    cli_run = store.create_run("c", CONFIG, None, launcher="cli", pid=os.getpid())
    a, c = store.get_run(app_run), store.get_run(cli_run)
    assert (a["launcher"], a["pid"], a["status"]) == ("app", None, "queued")
    assert (c["launcher"], c["pid"], c["status"]) == ("cli", os.getpid(), "queued") and c["pid_at"]
    with pytest.raises(StoreError, match="launcher: must be one of app, cli, got 'cron'"):
        store.create_run("x", CONFIG, None, launcher="cron")


def test_a_history_without_launcher_keeps_its_app_queue(tmp_path: Path) -> None:
    import sqlite3

    with open_store(tmp_path / "runs") as s:
        queued = s.create_run("q", CONFIG, None)
        launched = s.create_run("l", CONFIG, None)
        s.set_pid(launched, os.getpid())
    con = sqlite3.connect(tmp_path / "runs" / "jagg.db")
    con.execute("ALTER TABLE runs DROP COLUMN launcher")  # as an older version wrote it
    con.commit()
    con.close()
    with open_store(tmp_path / "runs") as s:
        assert s.get_run(queued)["launcher"] == "app"  # it was waiting in the app's queue
        assert s.get_run(launched)["launcher"] is None


def test_cancel_flag(store: RunStore) -> None:
    run_id = _run(store, status="running")
    assert store.cancel_requested(run_id) is False
    store.request_cancel(run_id)
    assert store.cancel_requested(run_id) is True
    with RunStore(store.path) as other:  # what the trainer sees through its own connection
        assert other.cancel_requested(run_id) is True
    with pytest.raises(StoreError):
        store.request_cancel(run_id + 1)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid no longer exists
    return proc.pid


def test_liveness_marks_dead_pid_failed_with_log_tail(store: RunStore) -> None:
    dead = _run(store, "dead")
    lines = [f"step {i}" for i in range(40)] + [
        "Traceback (most recent call last):",
        "RuntimeError: out of memory",
    ]
    (store.runs_root / "dead" / "train.log").write_text("\n".join(lines) + "\n")
    store.set_status(dead, "running", pid=_dead_pid())
    alive = _run(store, "alive", status="running")  # this test's own pid
    no_log = _run(store, "nolog")
    store.set_status(no_log, "running", pid=_dead_pid())
    unlaunched = _run(store, "queued-without-pid")

    assert sorted(store.check_liveness()) == sorted([dead, no_log])
    run = store.get_run(dead)
    assert run["status"] == "failed" and run["finished_at"] is not None
    assert "exited without reporting" in run["error"]
    assert run["error"].endswith("Traceback (most recent call last):\nRuntimeError: out of memory")
    assert "step 21" not in run["error"] and "step 22" in run["error"]  # the last 20 lines
    assert store.get_run(no_log)["error"].startswith("process ")
    assert store.get_run(alive)["status"] == "running"
    assert store.get_run(unlaunched)["status"] == "queued"
    assert store.check_liveness() == []  # already failed: nothing more to do


def test_zombie_counts_as_dead() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("zombie detection reads /proc")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while pid_alive(proc.pid) and time.monotonic() < deadline:  # exited but not reaped: a zombie
            time.sleep(0.02)
        assert not pid_alive(proc.pid)
        os.kill(proc.pid, 0)  # it still exists as a process-table entry
    finally:
        proc.wait()
    assert pid_alive(os.getpid()) and not pid_alive(0)


def test_a_reused_pid_does_not_keep_a_dead_run_alive(store: RunStore) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("process start times are read from /proc")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live, reused = _run(store, "live"), _run(store, "reused")
        for run_id in (live, reused):
            store.set_status(run_id, "running", pid=proc.pid)
        assert store.get_run(live)["pid_at"] >= time.time() - 60
        # the run "reused" recorded this pid an hour ago: the process holding it now started later
        store.db.execute("UPDATE runs SET pid_at = ? WHERE id = ?", [time.time() - 3600, reused])
        store.db.conn.commit()
        assert pid_alive(proc.pid) and pid_alive(proc.pid, time.time())
        assert not pid_alive(proc.pid, time.time() - 3600)
        assert store.check_liveness() == [reused]
        assert store.get_run(live)["status"] == "running"
        assert "exited without reporting" in store.get_run(reused)["error"]
    finally:
        proc.kill()
        proc.wait()


def test_a_history_without_pid_at_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "runs" / "jagg.db"
    db.parent.mkdir()
    con = sqlite3.connect(db)
    con.execute(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, config TEXT NOT NULL,"
        " status TEXT NOT NULL DEFAULT 'queued', pid INTEGER, created_at REAL NOT NULL, started_at REAL,"
        " finished_at REAL, error TEXT, run_dir TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,"
        " last_step INTEGER, paired_run_id INTEGER)"
    )
    con.execute(
        "INSERT INTO runs (name, config, status, pid, created_at) VALUES ('old', '{}', 'running', 1, 0)"
    )
    con.commit()
    con.close()
    with open_store(tmp_path / "runs") as s:
        run = s.get_run(1)
        assert run["name"] == "old" and run["pid_at"] is None
        assert s.check_liveness() == ([] if pid_alive(1) else [1])  # old rows: checked by pid alone


def test_probes_and_samples_upsert(store: RunStore) -> None:
    run_id = _run(store, status="running")
    probes = [
        {"group_index": g, "t_start": 1 - g / 3, "t_end": 0.75 - g / 3, "cosine": 0.9, "rel_error": 0.1}
        for g in range(2)
    ]
    store.log_probes(run_id, 5, probes)
    store.log_probes(
        run_id, 5, [{**probes[0], "cosine": 0.95}, {**probes[0], "method": "endpoint", "cosine": 0.7}]
    )
    rows = store.probes(run_id)
    assert [(r["group_index"], r["method"], r["cosine"]) for r in rows] == [
        (0, "endpoint", 0.7),
        (0, "jagg", 0.95),
        (1, "jagg", 0.9),
    ]
    sample = {
        "kind": "train",
        "prompt": "a red circle left",
        "seed": 3,
        "reward": 0.5,
        "path": "samples/5/0.png",
    }
    store.log_samples(run_id, 5, [sample, {**sample, "path": "samples/5/1.png", "reward": None}])
    store.log_samples(run_id, 5, [{**sample, "reward": 0.75}])
    assert [(s["path"], s["reward"]) for s in store.samples(run_id)] == [
        ("samples/5/0.png", 0.75),
        ("samples/5/1.png", None),
    ]
    assert store.samples(run_id, kind="eval") == []
    with pytest.raises(StoreError, match="sample kind: must be one of train, eval"):
        store.log_samples(run_id, 5, [{**sample, "kind": "val"}])
    with pytest.raises(StoreError, match="sample path: must be relative to the run folder"):
        store.log_samples(run_id, 5, [{**sample, "path": "/tmp/x.png"}])


def test_truncate_after_for_resume(store: RunStore) -> None:
    run_id = _run(store, status="running")
    for step in range(1, 6):
        store.log_step(run_id, step, {"reward/mean": step / 10})
    store.log_samples(run_id, 4, [{"kind": "train", "path": "s4.png"}])
    store.log_probes(
        run_id, 2, [{"group_index": 0, "t_start": 1, "t_end": 0.7, "cosine": 0.9, "rel_error": 0.2}]
    )
    store.truncate_after(run_id, 3)  # the checkpoint was at step 3
    assert store.metrics_frame(run_id)["step"].tolist() == [1, 2, 3]
    assert store.get_run(run_id)["last_step"] == 3
    assert store.samples(run_id) == [] and len(store.probes(run_id)) == 1


def test_export_writes_the_runs_rows(store: RunStore, tmp_path: Path) -> None:
    run_id = _run(store, "exp name/1", status="running")
    other = _run(store, "other", status="running")
    store.log_step(other, 1, {"reward/mean": 9.0})
    for step in (1, 2, 3):
        store.log_step(run_id, step, {"reward/mean": step / 10, "loss/policy": -step})
    store.log_step(run_id, 3, {"eval/reward/mean": 0.8})
    store.log_samples(run_id, 3, [{"kind": "eval", "prompt": "p", "seed": 0, "reward": 0.8, "path": "e.png"}])
    csv_path, json_path = store.export_run(run_id, tmp_path / "out")
    assert (
        csv_path.name == f"run-{run_id}-exp-name-1.csv" and json_path.name == f"run-{run_id}-exp-name-1.json"
    )
    frame = pd.read_csv(csv_path)
    assert list(frame.columns) == ["step", "eval/reward/mean", "loss/policy", "reward/mean"]
    assert frame["step"].tolist() == [1, 2, 3] and frame["reward/mean"].tolist() == [0.1, 0.2, 0.3]
    doc = json.loads(json_path.read_text())
    assert doc["run"]["id"] == run_id and doc["run"]["config"] == CONFIG
    assert len(doc["metrics"]) == 7 and all(m["value"] != 9.0 for m in doc["metrics"])
    assert doc["samples"][0]["path"] == "e.png" and doc["probes"] == []
    with pytest.raises(StoreError, match="no run with id 999"):
        store.export_run(999, tmp_path / "out")


def test_final_reward_prefers_eval(store: RunStore) -> None:
    a, b, c = _run(store, "a", "running"), _run(store, "b", "running"), _run(store, "c")
    store.log_step(a, 1, {"reward/mean": 0.1, "eval/reward/mean": 0.5})
    store.log_step(a, 2, {"reward/mean": 0.2})
    store.log_step(a, 3, {"eval/reward/mean": 0.7})
    store.log_step(b, 1, {"reward/mean": 0.3})
    store.log_step(b, 2, {"reward/mean": 0.4})
    finals = {r["id"]: (r["final_reward_key"], r["final_reward"]) for r in store.list_runs()}
    assert finals == {a: ("eval/reward/mean", 0.7), b: ("reward/mean", 0.4), c: (None, None)}
    assert store.last_values(a, ["reward/mean", "nope"]) == {"reward/mean": (2, 0.2)}


def test_delete_run(store: RunStore, tmp_path: Path) -> None:
    keep = _run(store, "keep", status="running")
    gone = _run(store, "gone")
    store.set_paired(keep, gone)
    store.log_step(gone, 1, {"a": 1.0})
    store.log_samples(gone, 1, [{"kind": "train", "path": "x.png"}])
    (store.runs_root / "gone" / "x.png").write_bytes(b"png")
    with pytest.raises(StoreError, match=f"run {keep}: is running .*cancel it first"):
        store.delete_run(keep)
    assert store.delete_run(gone, delete_files=True) is True
    assert not (store.runs_root / "gone").exists() and (store.runs_root / "keep").exists()
    assert store.get_run(gone) is None and store.get_run(keep)["paired_run_id"] is None
    for table in ("metrics", "samples"):
        assert store.db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", [gone]).fetchone()[0] == 0
    assert _run(store, "next") > gone  # ids are never reused

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    far = store.create_run("far", CONFIG, outside)
    assert store.delete_run(far, delete_files=True) is False and outside.exists()
    root = store.create_run("root", CONFIG, store.runs_root)
    assert store.delete_run(root, delete_files=True) is False and store.path.exists()
    link = store.runs_root / "link"
    link.symlink_to(outside)
    linked = store.create_run("link", CONFIG, None)
    store.db.execute("UPDATE runs SET run_dir = ? WHERE id = ?", [str(link), linked])
    store.db.conn.commit()
    assert store.delete_run(linked, delete_files=True) is False and outside.exists()


def test_concurrent_writer_and_reader(store: RunStore) -> None:
    run_id = _run(store, status="running")
    errors: list[BaseException] = []
    steps = 150

    def write() -> None:
        try:
            with RunStore(store.path) as writer:
                for step in range(steps):
                    writer.log_step(
                        run_id, step, {"reward/mean": step, "loss/policy": -step, "time/step": 0.1}
                    )
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    reads = 0
    with RunStore(store.path) as reader:
        while thread.is_alive() or reads == 0:
            frame = reader.metrics_frame(run_id)
            assert frame["step"].is_monotonic_increasing
            reader.list_runs()
            reads += 1
    thread.join()
    assert not errors, errors
    assert len(store.metrics_frame(run_id)) == steps and reads > 1


# ---------------------------------------------------------------------- jagg runs / jagg export


def _args(add, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def test_runs_command_prints_a_table(store: RunStore, capsys: pytest.CaptureFixture[str]) -> None:
    done = _run(store, "tiny-jagg", status="running")
    store.log_step(done, 49, {"eval/reward/mean": 0.8543})
    store.set_status(done, "finished")
    store.db.execute("UPDATE runs SET started_at = finished_at - 491 WHERE id = ?", [done])
    store.db.conn.commit()
    _run(store, "waiting")
    assert runs_cli.run_runs(_args(runs_cli.add_runs_arguments, ["--runs-dir", str(store.runs_root)])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "id", "name", "status", "backbone", "W", "jagg_frac", "strategy", "last", "step", "final", "reward", "duration"
    ]  # fmt: skip
    row = next(line for line in lines if "tiny-jagg" in line).split()
    assert row == [
        str(done),
        "tiny-jagg",
        "finished",
        "tiny-shapes",
        "4",
        "0.6",
        "jagg",
        "49",
        "0.8543",
        "(eval)",
        "8m",
        "11s",
    ]
    assert any(line.split()[1:3] == ["waiting", "queued"] for line in lines)


def test_runs_command_without_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert runs_cli.run_runs(_args(runs_cli.add_runs_arguments, ["--runs-dir", str(tmp_path / "none")])) == 0
    assert "no runs yet" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()  # reading never creates the database


def test_export_command(store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _run(store, "e", status="running")
    store.log_step(run_id, 1, {"reward/mean": 0.5})
    out = tmp_path / "export"
    argv = [str(run_id), "--runs-dir", str(store.runs_root), "--out", str(out)]
    assert runs_cli.run_export(_args(runs_cli.add_export_arguments, argv)) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / f"run-{run_id}-e.csv"), str(out / f"run-{run_id}-e.json")]
    assert all(Path(p).exists() for p in printed)

    argv = ["999", "--runs-dir", str(store.runs_root), "--out", str(out)]
    assert runs_cli.run_export(_args(runs_cli.add_export_arguments, argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("jagg export: no run with id 999 in ")
    argv = ["1", "--runs-dir", str(tmp_path / "missing")]
    assert runs_cli.run_export(_args(runs_cli.add_export_arguments, argv)) == 2
    assert capsys.readouterr().err.startswith("jagg export: no run database at ")


# ---------------------------------------------------------------------- run lists that stay fast


def _vm_steps(store: RunStore, fn) -> tuple[int, list[str]]:
    """SQLite virtual-machine instructions run by ``fn()`` (rows read and compared, not time) and its SQL."""
    steps, sql = [0], []

    def count() -> int:
        steps[0] += 1
        return 0

    store.db.conn.set_progress_handler(count, 1)
    store.db.conn.set_trace_callback(sql.append)
    try:
        fn()
    finally:
        store.db.conn.set_progress_handler(None, 1)
        store.db.conn.set_trace_callback(None)
    return steps[0], sql


def _history(store: RunStore, runs: int, steps: int) -> None:
    keys = ["reward/mean", "reward/std", "eval/reward/mean", "loss/policy", "time/update"]
    for i in range(runs):
        run_id = _run(store, f"r{i}", "running")
        for step in range(steps):
            store.log_step(run_id, step, {k: step + j for j, k in enumerate(keys)})


def test_run_lists_never_read_the_metrics_table(tmp_path: Path) -> None:
    """list_runs reads the same rows whether the runs logged 3 steps or 120: its work is O(runs)."""
    costs = {}
    for steps in (3, 120):
        with open_store(tmp_path / f"runs-{steps}") as s:
            _history(s, runs=4, steps=steps)
            runs = s.list_runs()
            assert [r["final_reward"] for r in runs] == [
                steps - 1 + 2
            ] * 4  # eval/reward/mean at the last step
            costs[steps], sql = _vm_steps(s, s.list_runs)
            assert sql and not any("metrics" in q for q in sql), sql
            first = runs[0]["id"]
            last, _ = _vm_steps(
                s, lambda s=s, first=first: s.last_values(first, ["reward/mean", "loss/policy"])
            )
            costs[f"last-{steps}"] = last
    assert costs[3] == costs[120] and costs["last-3"] == costs["last-120"], costs


def test_latest_values_follow_truncate_delete_and_nan(store: RunStore) -> None:
    run_id = _run(store, "a", "running")
    for step in range(1, 6):
        store.log_step(run_id, step, {"reward/mean": step / 10, **({"only5": 5.0} if step == 5 else {})})
    store.log_step(run_id, 2, {"reward/mean": 9.0})  # an older step logged again does not win
    assert store.last_values(run_id, ["reward/mean", "only5"]) == {"reward/mean": (5, 0.5), "only5": (5, 5.0)}
    store.truncate_after(run_id, 3)
    assert store.last_values(run_id, ["reward/mean", "only5"]) == {"reward/mean": (3, 0.3)}
    store.log_step(run_id, 4, {"reward/mean": math.nan})  # NaN at the last step is the final value (NULL)
    assert store.last_values(run_id, ["reward/mean"]) == {"reward/mean": (4, None)}
    assert store.list_runs()[0]["final_reward"] is None
    store.set_status(run_id, "failed")
    store.delete_run(run_id)
    assert store.db.execute("SELECT COUNT(*) FROM latest").fetchone()[0] == 0


def test_a_history_without_the_latest_table_is_filled_once(tmp_path: Path) -> None:
    with open_store(tmp_path / "runs") as s:
        a, b = _run(s, "a", "running"), _run(s, "b", "running")
        for step in range(4):
            s.log_step(a, step, {"reward/mean": step, "eval/reward/mean": 10 + step})
            s.log_step(b, step, {"reward/mean": -step})
        s.db.execute("DROP TABLE latest")  # as written by a version without it
        s.db.conn.commit()
    with open_store(tmp_path / "runs") as s:
        finals = {r["id"]: (r["final_reward_key"], r["final_reward"]) for r in s.list_runs()}
        assert finals == {a: ("eval/reward/mean", 13.0), b: ("reward/mean", -3.0)}
        assert s.last_values(a, ["reward/mean"]) == {"reward/mean": (3, 3.0)}


def test_a_read_only_history_without_the_latest_table_still_lists_final_rewards(tmp_path: Path) -> None:
    with open_store(tmp_path / "runs") as s:
        a = _run(s, "a", "running")
        for step in range(3):
            s.log_step(a, step, {"reward/mean": step, "loss/policy": -step})
        s.db.execute("DROP TABLE latest")  # written by a version without it; read-only: cannot be migrated
        s.db.conn.commit()
    with open_store(tmp_path / "runs", read_only=True) as s:
        assert "latest" not in s.db.table_names()
        assert [(r["final_reward_key"], r["final_reward"]) for r in s.list_runs()] == [("reward/mean", 2.0)]
        assert s.last_values(a, ["loss/policy"]) == {"loss/policy": (2, -2.0)}
