"""app/runs.py with a fake trainer: launch in its own process group, cancel (cooperative and killed), queue
order, pairs, and picking up after an app restart."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from polling import spawn, tail

from app import data
from app.runs import THREAD_VARS, RunManager, group_alive, plan_pair
from jagg_engine.store import StoreError, open_store, pid_alive
from jagg_engine.train.config import TrainConfig

# The trainer's contract with the app, in miniature: status running with its pid, one metrics row per step,
# stop between steps when asked, final status. A run named "stubborn…" ignores the cancel request and
# keeps a child process in its group (the app must kill both). Each step also records when it ran and the
# CPU threads its process was given.
FAKE_TRAINER = textwrap.dedent(
    """
    import argparse, os, subprocess, sys, time
    from jagg_engine.store import open_store

    p = argparse.ArgumentParser()
    p.add_argument("--run-id", type=int)
    p.add_argument("--runs-dir")
    a = p.parse_args()
    store = open_store(a.runs_dir)
    run = store.get_run(a.run_id)
    time.sleep(float(os.environ.get("FAKE_START_S", "0")))  # loading a model
    store.set_status(a.run_id, "running", pid=os.getpid())  # clears cancel_requested
    stubborn = run["name"].startswith("stubborn")
    if stubborn:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("fake trainer", a.run_id, flush=True)
    for step in range(run["config"]["steps"]):
        if store.cancel_requested(a.run_id) and not stubborn:
            store.set_status(a.run_id, "cancelled")
            sys.exit(0)
        threads = int(os.environ.get("OMP_NUM_THREADS", "0"))  # 0: not set, torch's default
        store.log_step(
            a.run_id, step, {"reward/mean": step, "time/update": 0.1, "fake/wall": time.time(), "fake/threads": threads}
        )
        time.sleep(float(os.environ.get("FAKE_STEP_S", "0.1")))
    store.set_status(a.run_id, "finished")
    """
)


@pytest.fixture
def manager_factory(tmp_path):
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    made = []

    def make(**kwargs):
        env = {
            **{k: v for k, v in os.environ.items() if k not in THREAD_VARS},
            "FAKE_STEP_S": str(kwargs.pop("step_s", 0.1)),
            "FAKE_START_S": str(kwargs.pop("start_s", 0.0)),
        }
        m = RunManager(
            tmp_path / "runs",
            command=lambda run_id, runs_dir: [
                sys.executable,
                str(script),
                "--run-id",
                str(run_id),
                "--runs-dir",
                str(runs_dir),
            ],
            env=env,
            **kwargs,
        )
        made.append(m)
        return m

    yield make
    cleaner = RunManager(tmp_path / "runs")  # leave no fake trainer behind
    for run in cleaner.store.list_runs():
        if run["pid"] and pid_alive(run["pid"]) and run["status"] in ("queued", "running"):
            cleaner.kill(run["id"])
    for m in [*made, cleaner]:
        m.shutdown()


def _config(name="fake", steps=3):
    return TrainConfig.from_dict({"name": name, "steps": steps}).to_dict()


def _wait(predicate, timeout=30.0, manager=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if manager is not None:
            manager.tick()
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_launch_runs_in_its_own_process_group_and_finishes(manager_factory):
    m = manager_factory(step_s=0.5)
    run_id = m.create(_config(steps=4))
    run = m.store.get_run(run_id)
    assert run["status"] == "queued" and run["pid"] is None and run["run_dir"].endswith(f"run-{run_id:04d}")
    assert m.tick() == [run_id]
    pid = m.store.get_run(run_id)["pid"]
    assert os.getpgid(pid) == pid and os.getpgid(pid) != os.getpgid(0)
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "finished", manager=m)
    assert m.store.metrics_frame(run_id)["reward/mean"].tolist() == [0, 1, 2, 3]
    assert m.active() == [] and m.pending() == []
    assert "fake trainer" in (m.runs_dir / f"run-{run_id:04d}" / "stdout.log").read_text()


def test_cooperative_cancel(manager_factory):
    m = manager_factory(step_s=0.5)
    run_id = m.create(_config(steps=200))
    m.tick()
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "running")
    m.cancel(run_id)
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "cancelled", manager=m)
    pid = m.store.get_run(run_id)["pid"]
    assert _wait(lambda: not group_alive(pid), manager=m)


def test_cancel_before_the_trainer_marks_itself_running_is_not_lost(manager_factory):
    m = manager_factory(step_s=0.5, start_s=1.5, cancel_timeout=60.0)
    run_id = m.create(_config(steps=200))
    m.tick()
    m.cancel(run_id)  # the trainer is still "loading"; its switch to running clears the flag
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "cancelled", timeout=20, manager=m)
    assert not (m.store.get_run(run_id)["error"] or "").startswith("killed"), "not a cooperative stop"
    # the manager asks again as soon as it sees the flag cleared: on a busy machine that can come before the
    # trainer's first check, which then stops before its first step (last_step None); either way, within a step
    last_step = m.store.get_run(run_id)["last_step"]
    assert last_step is None or last_step < 10, last_step


def test_cancel_kills_the_process_group_after_the_timeout(manager_factory):
    m = manager_factory(step_s=0.5, cancel_timeout=1.0)
    run_id = m.create(_config(name="stubborn", steps=200))
    m.tick()
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "running")
    pid = m.store.get_run(run_id)["pid"]
    assert _wait(lambda: len([p for p in os.listdir("/proc") if p.isdigit() and _pgid(p) == pid]) >= 2)
    m.cancel(run_id)
    time.sleep(0.3)
    m.tick()
    assert m.store.get_run(run_id)["status"] == "running", "killed before the timeout"
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "cancelled", timeout=15, manager=m)
    assert not group_alive(pid), "a process of the run's group survived"
    assert "killed" in m.store.get_run(run_id)["error"]


def _pgid(pid: str) -> int | None:
    try:
        return os.getpgid(int(pid))
    except OSError:
        return None


@pytest.mark.parametrize(
    "machine, reason",
    [({"cores": 1, "gpu": False}, "1 CPU core(s): too few"), ({"cores": 8, "gpu": True}, "a GPU machine")],
    ids=["one-core", "gpu-machine"],  # not "gpu": that id would be the GPU-only marker
)
def test_queue_runs_one_at_a_time_in_order_and_pairs(manager_factory, machine, reason):
    """No room for a pair side by side: it runs one after the other, exact first, with torch's own threads."""
    m = manager_factory(step_s=0.2, **machine)
    first = m.create(_config(name="a", steps=2))
    exact_id, jagg_id = m.create_pair(_config(name="b", steps=2))
    exact, jagg = m.store.get_run(exact_id), m.store.get_run(jagg_id)
    assert (exact["config"]["strategy"], jagg["config"]["strategy"]) == ("exact", "jagg")
    assert exact["paired_run_id"] == jagg_id and jagg["paired_run_id"] == exact_id
    assert (
        exact["pair_mode"] == jagg["pair_mode"] == "sequential"
        and m.store.get_run(first)["pair_mode"] is None
    )
    same = {k: v for k, v in exact["config"].items() if k not in ("strategy", "name")}
    assert same == {k: v for k, v in jagg["config"].items() if k not in ("strategy", "name")}
    message = m.pair_message(exact_id, jagg_id)
    assert message.startswith(f"Pair one after the other: exact #{exact_id}, then JAGG #{jagg_id}"), message
    assert reason in message and "\n" not in message

    assert m.tick() == [first]
    assert m.tick() == [], "a second run started while the first is active"
    assert _wait(lambda: all(r["status"] == "finished" for r in m.store.list_runs()), manager=m)
    runs = sorted(m.store.list_runs(), key=lambda r: r["started_at"])
    assert [r["id"] for r in runs] == [first, exact_id, jagg_id]
    for before, after in zip(runs, runs[1:]):
        assert after["started_at"] >= before["finished_at"]
    for run_id in (exact_id, jagg_id):
        assert set(m.store.metrics_frame(run_id)["fake/threads"]) == {0}, "a sequential run gets every core"


def test_cancel_a_queued_run_that_has_not_started(manager_factory):
    m = manager_factory(step_s=0.3)
    running = m.create(_config(steps=5))
    waiting = m.create(_config(steps=5))
    m.tick()
    assert "not started" in m.cancel(waiting)
    assert m.store.get_run(waiting)["status"] == "cancelled"
    assert _wait(lambda: m.store.get_run(running)["status"] == "finished", manager=m)
    assert m.store.get_run(waiting)["pid"] is None


def test_a_restarted_manager_reattaches(manager_factory, tmp_path):
    m = manager_factory(step_s=0.3)
    run_id = m.create(_config(steps=6))
    queued = m.create(_config(steps=1))
    m.tick()
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "running")
    m.shutdown()  # the app goes away; the run keeps training

    # a dead run left by a crashed trainer
    store = open_store(tmp_path / "runs")
    dead = store.create_run("dead", _config(), tmp_path / "runs" / "dead")
    store.set_status(dead, "running", pid=2**22 + 12345)
    store.close()

    m2 = manager_factory(step_s=0.3)
    assert m2.tick() == []  # the live run still counts as active
    assert m2.store.get_run(dead)["status"] == "failed"
    assert _wait(lambda: m2.store.get_run(run_id)["status"] == "finished", manager=m2)
    assert _wait(lambda: m2.store.get_run(queued)["status"] == "finished", manager=m2)


def test_the_lifecycle_module_does_not_import_torch():
    import subprocess

    code = "import sys, app.runs; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_the_app_starts_only_runs_it_queued(manager_factory, tmp_path):
    m = manager_factory()
    other = m.store.create_run("by-hand", _config(), tmp_path / "runs" / "by-hand")  # no launcher, no pid
    cli = m.store.create_run("cli", _config(), None, launcher="cli")
    assert m.tick() == [] and m.pending() == []
    for run_id in (other, cli):
        with pytest.raises(StoreError, match="only a queued run starts"):
            m.start(run_id)
        assert m.store.get_run(run_id)["status"] == "queued" and m.store.get_run(run_id)["pid"] is None
    mine = m.create(_config(steps=1))
    assert m.tick() == [mine]


@pytest.mark.slow
def test_the_apps_queue_ticking_never_starts_a_run_of_jagg_train(tmp_path):
    """`jagg train --processes 2` creates its run in the folder the app watches; while accelerate starts and
    the model loads, the app's queue ticks every 50 ms with the REAL trainer command: it must start nothing."""
    runs = tmp_path / "runs"
    manager = RunManager(runs)
    small = ["prompts_per_step=2", "group_size=2", "sampling_steps=6", "sde_window_end=4", "eval_every=0"]
    log = tmp_path / "train.out"  # a file, not a pipe nobody reads while the ticks poll (polling.spawn)
    proc = spawn(
        [sys.executable, "-m", "jagg_engine.cli", "train", "steps=1", "sample_every=0", *small,
         "--processes", "2", "--runs-dir", str(runs)],
        log, start_new_session=True,
    )  # fmt: skip
    seen = []
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            assert manager.tick() == [], "the app started a run that jagg train created"
            for run in manager.store.list_runs():
                seen.append((run["status"], run["pid"]))
                assert run["status"] != "queued" or run["pid"] == proc.pid, run
            time.sleep(0.05)
        assert proc.wait(timeout=600) == 0, tail(log)
        assert ("queued", proc.pid) in seen  # the ticks did see the run while its model loaded
        assert manager._children == {}
        (run,) = manager.store.list_runs()
        assert run["status"] == "finished" and run["launcher"] == "cli"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        manager.shutdown()


def test_a_resumed_run_is_not_cancelled_again_by_the_cancel_that_ended_it(manager_factory, tmp_path):
    m = manager_factory(step_s=0.3, cancel_timeout=60.0)
    m.resume_command = m.command  # the fake trainer takes the same arguments for both
    run_id = m.create(_config(steps=200))
    m.tick()
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "running")
    m.cancel(run_id)
    # No tick of the app between the cooperative stop and the resume (a busy machine, a slow timer).
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "cancelled")
    first_pid = m.store.get_run(run_id)["pid"]
    assert _wait(lambda: not group_alive(first_pid))
    m.resume(run_id)
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "running")
    for _ in range(15):  # ticks while the resumed trainer runs must not ask it to stop
        m.tick()
        time.sleep(0.1)
    run = m.store.get_run(run_id)
    assert (run["status"], run["cancel_requested"]) == ("running", False)
    m.cancel(run_id)
    assert _wait(lambda: m.store.get_run(run_id)["status"] == "cancelled", manager=m)


# ---------------------------------------------------------------------------------------------- compare pairs


def test_plan_pair_needs_a_cpu_machine_with_a_core_per_process_of_each_run():
    assert (plan_pair(1, 3, False).mode, plan_pair(1, 3, False).threads) == ("side-by-side", 1)
    assert (plan_pair(1, 2, False).mode, plan_pair(1, 2, False).threads) == ("side-by-side", 1)
    assert (plan_pair(2, 16, False).mode, plan_pair(2, 16, False).threads) == ("side-by-side", 4)
    assert plan_pair(1, 1, False).mode == plan_pair(2, 3, False).mode == "sequential"
    gpu = plan_pair(1, 64, True)
    assert (gpu.mode, gpu.threads, gpu.reason) == (
        "sequential",
        0,
        "a GPU machine: each run has the GPU to itself",
    )


def _wall(m, run_id):
    return m.store.metrics_frame(run_id)["fake/wall"].tolist()


def test_a_pair_runs_side_by_side_with_the_cores_split_and_takes_one_slot(manager_factory):
    m = manager_factory(step_s=0.3, cores=2, gpu=False)  # max_concurrent 1, as the app has it
    exact_id, jagg_id = m.create_pair(_config(name="p", steps=6))
    assert m.store.get_run(exact_id)["pair_mode"] == m.store.get_run(jagg_id)["pair_mode"] == "side-by-side"
    assert m.tick() == [exact_id, jagg_id], "both runs of the pair start in the same pass"
    message = m.pair_message(exact_id, jagg_id)
    assert message == (
        f"Pair side by side: exact #{exact_id} and JAGG #{jagg_id} started together (same config, prompts and"
        " seeds; 1 CPU thread each of the 2 cores), so both are timed under the same load."
    )
    later = m.create(_config(name="later", steps=2))
    assert m.tick() == [], "the pair holds the one slot"
    assert _wait(lambda: m.store.get_run(later)["status"] == "finished", manager=m)

    exact, jagg, single = (m.store.get_run(i) for i in (exact_id, jagg_id, later))
    e, j = _wall(m, exact_id), _wall(m, jagg_id)
    assert len(e) == len(j) == 6
    # At one moment both runs were between their first and their last step: they trained at the same time.
    assert max(e[0], j[0]) < min(e[-1], j[-1]), (e, j)
    assert single["started_at"] >= max(exact["finished_at"], jagg["finished_at"])
    for run_id in (exact_id, jagg_id):
        assert set(m.store.metrics_frame(run_id)["fake/threads"]) == {1}, (
            "each process of the pair gets 1 thread"
        )
    assert set(m.store.metrics_frame(later)["fake/threads"]) == {0}, "a run alone keeps torch's own threads"
    # The Live view's speedup row of the jagg run is measured against its pair and says how it was timed.
    row = data.speedup_frame(m.store, jagg_id, r=1.8).iloc[0]
    assert (row["paired exact run"], row["pair timed"]) == (f"#{exact_id}", "side-by-side")


def test_a_queued_pair_starts_both_runs_together_when_the_slot_frees(manager_factory):
    m = manager_factory(step_s=0.3, cores=2, gpu=False)
    ahead = m.create(_config(name="ahead", steps=4))
    assert m.tick() == [ahead]
    exact_id, jagg_id = m.create_pair(_config(name="p", steps=2))
    assert "queued; they start together when the runs ahead finish" in m.pair_message(exact_id, jagg_id)
    passes = []
    deadline = time.time() + 30
    while time.time() < deadline and {m.store.get_run(i)["status"] for i in (exact_id, jagg_id)} != {
        "finished"
    }:
        started = m.tick()
        if started:
            passes.append((started, m.store.get_run(ahead)["status"]))
        time.sleep(0.05)
    assert passes == [([exact_id, jagg_id], "finished")], "one pass started both, after the run ahead ended"


def test_a_resumed_run_of_a_pair_rejoins_its_partner_with_the_same_threads(manager_factory):
    m = manager_factory(step_s=0.3, cores=2, gpu=False, cancel_timeout=60.0)
    m.resume_command = m.command  # the fake trainer takes the same arguments for both
    exact_id, jagg_id = m.create_pair(_config(name="p", steps=30))
    m.tick()
    assert _wait(lambda: m.store.get_run(jagg_id)["status"] == "running")
    m.cancel(jagg_id)
    assert _wait(lambda: m.store.get_run(jagg_id)["status"] == "cancelled", manager=m)
    other = m.create(_config(name="other", steps=1))
    assert m.tick() == [], "the exact run still holds the pair's slot"
    m.resume(jagg_id)  # its partner's slot: allowed although max_concurrent is 1 and a run is active
    assert _wait(lambda: m.store.get_run(jagg_id)["status"] == "running")
    # a step logged (on a busy machine the run can be cancelled, and marked running again, before its first)
    assert _wait(lambda: "fake/threads" in m.store.metrics_frame(jagg_id).columns, timeout=300)
    assert set(m.store.metrics_frame(jagg_id)["fake/threads"].dropna()) == {1}
    for run_id in (exact_id, jagg_id):
        m.cancel(run_id)
    assert _wait(lambda: m.store.get_run(other)["status"] == "finished", manager=m)


def test_a_sequential_pair_stays_one_after_the_other_with_two_slots(manager_factory):
    m = manager_factory(step_s=0.2, cores=8, gpu=True, max_concurrent=2)
    exact_id, jagg_id = m.create_pair(_config(name="p", steps=3))
    assert m.tick() == [exact_id]
    assert m.tick() == [], "the second run of a sequential pair started while the first trains"
    other = m.create(_config(name="other", steps=1))
    assert m.tick() == [other], "the free slot still serves the rest of the queue"
    assert _wait(lambda: m.store.get_run(jagg_id)["status"] == "finished", manager=m)
    exact, jagg = m.store.get_run(exact_id), m.store.get_run(jagg_id)
    assert jagg["started_at"] >= exact["finished_at"]


def test_a_pair_whose_second_trainer_cannot_start_leaves_no_half_training(manager_factory):
    m = manager_factory(step_s=0.3, cores=2, gpu=False)
    exact_id, jagg_id = m.create_pair(_config(name="p", steps=50))
    fake = m.command
    m.command = lambda run_id, runs_dir: (
        ["/nonexistent/python", "-m", "jagg_engine.cli"] if run_id == jagg_id else fake(run_id, runs_dir)
    )
    assert m.tick() == []
    exact, jagg = m.store.get_run(exact_id), m.store.get_run(jagg_id)
    assert (exact["status"], jagg["status"]) == ("failed", "failed")
    assert exact["error"].startswith("its pair run could not start: FileNotFoundError")
    assert jagg["error"].startswith("could not start the trainer: FileNotFoundError") and jagg["pid"] is None
    assert not group_alive(exact["pid"]), "the half of the pair that started was stopped"
    m.command = fake
    after = m.create(_config(name="after", steps=1))
    assert m.tick() == [after], "the queue moves on"


@pytest.mark.slow
def test_a_real_tiny_pair_trains_side_by_side_and_gives_the_apps_measured_speedup(tmp_path):
    """The real trainer on the 2-core CPU: both runs of the pair make progress at the same time, one torch
    thread each, and the Live view's measured speedup is the ratio of that pair's update times."""
    m = RunManager(tmp_path / "runs", cores=2, gpu=False)
    small = {"prompts_per_step": 2, "group_size": 2, "sampling_steps": 6, "sde_window_end": 4}
    off = {"eval_every": 0, "sample_every": 0, "checkpoint_every": 0}
    steps = 24  # ~10 s of training: one trainer's slower start (3 s seen on a loaded 2-core machine) cannot hide the overlap
    exact_id, jagg_id = m.create_pair(_config(name="real", steps=steps) | small | off)
    seen: dict[int, dict[int, float]] = {exact_id: {}, jagg_id: {}}  # run → step → when it was first seen
    try:
        assert m.tick() == [exact_id, jagg_id]
        deadline = time.time() + 400
        while time.time() < deadline and not all(
            m.store.get_run(i)["status"] in ("finished", "failed") for i in seen
        ):
            now = time.time()
            for run_id, steps_seen in seen.items():
                for step in range(1, (m.store.get_run(run_id)["last_step"] or 0) + 1):
                    steps_seen.setdefault(step, now)
            m.tick()
            time.sleep(0.05)
        for run_id in seen:
            run = m.store.get_run(run_id)
            assert run["status"] == "finished", (run["error"], run_id)
            log = (Path(run["run_dir"]) / "train.log").read_text()
            assert "torch CPU threads: 1" in log
        # At one moment both had done a step and neither its last: they trained at the same time.
        first = max(seen[i][1] for i in seen)
        last = min(seen[i][steps] for i in seen)
        assert first < last, seen
        row = data.speedup_frame(m.store, jagg_id, r=1.8).iloc[0]
        exact_s = data.update_time(m.store.metrics_frame(exact_id))
        jagg_s = data.update_time(m.store.metrics_frame(jagg_id))
        assert (row["paired exact run"], row["pair timed"]) == (f"#{exact_id}", "side-by-side")
        assert row["measured speedup"] == pytest.approx(exact_s / jagg_s, rel=1e-3)
    finally:
        for run in m.store.list_runs():
            if run["status"] in ("queued", "running") and run["pid"]:
                m.kill(run["id"])
        m.shutdown()
