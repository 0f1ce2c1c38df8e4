"""`jagg race` under real faults: the driver killed with SIGKILL mid-race (no trainer outlives it, the race
reads interrupted at the next look, --report-only says partial), two races started together into one --out
(exactly one runs), a race whose driver is gone found by `jagg runs`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from polling import spawn, tail, wait_for
from toy import RACE_TINY

from app.runs import group_alive
from jagg_engine import race
from jagg_engine.race import heats
from jagg_engine.store import open_store, pid_alive

REPO = Path(__file__).resolve().parents[1]
TINY = RACE_TINY  # as tests/test_race.py (tests/toy.py)


def jagg(*args: str, wait: bool = True, **kwargs):
    cmd = [sys.executable, "-m", "jagg_engine.cli", *args]
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, **kwargs)
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, **kwargs
    )


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


# ------------------------------------------------------------------------------------------------ kill -9


@pytest.mark.slow
@pytest.mark.parametrize("also_the_watchdog", [False, True], ids=["driver", "driver-and-watchdog"])
def test_kill_9_of_the_driver_leaves_no_trainer_and_the_race_reads_interrupted_then_partial(
    tmp_path, also_the_watchdog
):
    """Killed alone, the driver's watchdog stops its trainers; killed with its watchdog too, each trainer's
    parent-death signal does."""
    out, log = tmp_path / "race", tmp_path / "race.log"
    cmd = [sys.executable, "-m", "jagg_engine.cli", "race", "--variant", "a:strategy=exact,steps=2", "--variant",
           "b:strategy=jagg,steps=5000", "--seeds", "0,1", "--out", str(out), "--threads", "1", *TINY]  # fmt: skip
    proc = spawn(cmd, log, cwd=REPO)  # a file, not a pipe nobody drains while the test waits

    def a_finished_and_b_trains() -> bool:
        if not (out / "runs" / "jagg.db").is_file() or not (out / "race.json").is_file():
            return False
        runs = json.loads((out / "race.json").read_text())["runs"]
        if len(runs) != 2:
            return False
        store = open_store(out / "runs")
        a, b = (store.get_run(r["run_id"]) for r in runs)
        store.close()
        return a["status"] == "finished" and b["status"] == "running" and (b["last_step"] or 0) >= 1

    deadline = time.time() + 600
    while not a_finished_and_b_trains():
        assert proc.poll() is None and time.time() < deadline, tail(log)
        time.sleep(0.5)
    store = open_store(out / "runs")
    b = store.get_run(json.loads((out / "race.json").read_text())["runs"][1]["run_id"])
    store.close()
    trainers = group_members(b["pid"])  # the trainer and anything it started, in its process group
    assert b["pid"] in trainers

    if also_the_watchdog:
        watchdog = json.loads((out / "race.json").read_text())["driver"]["watchdog_pid"]
        os.kill(watchdog, signal.SIGKILL)
        while pid_alive(watchdog):
            time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # the driver: no signal handler, no cleanup of its own
    proc.wait(timeout=30)
    # the watchdog stops them (SIGTERM, SIGKILL ORPHAN_GRACE_S later); how long that takes is not asserted
    gone = lambda: not group_alive(b["pid"]) and not any(pid_alive(pid) for pid in trainers)  # noqa: E731
    assert wait_for(gone, timeout=300), "a trainer of the race outlives the kill -9 of its driver"
    assert json.loads((out / "race.json").read_text())["status"] == "running"  # nobody has looked yet

    # `jagg runs` on the race's runs folder: the race reads interrupted, no run reads running.
    runs = jagg("runs", "--runs-dir", str(out / "runs"))
    assert runs.returncode == 0, runs.stderr
    assert runs.stderr.strip().splitlines() == [
        f"race {out}: interrupted: its driver (pid {proc.pid}) is gone"
    ]
    plan = json.loads((out / "race.json").read_text())
    assert (
        plan["status"] == "interrupted"
        and plan["interrupted"]["why"] == f"its driver (pid {proc.pid}) is gone"
    )
    store = open_store(out / "runs")
    assert store.get_run(b["id"])["status"] in ("cancelled", "failed")  # stopped, or killed and found dead
    store.close()

    # --report-only: one line that says the race is partial; only the finished run counts.
    rep = jagg("race", "--report-only", "--out", str(out))
    assert rep.returncode == 0, rep.stderr[-3000:]
    partial = (
        f"the race is interrupted (its driver (pid {proc.pid}) is gone): 1 of 4 planned runs finished; this"
        " report covers only them (partial)"
    )
    assert rep.stderr.strip().splitlines()[0] == f"jagg race: {partial}"
    result = json.loads((out / "race.json").read_text())
    assert result["status"] == "interrupted" and result["summary"]["partial"] == partial
    a_row, b_row = result["summary"]["variants"]
    assert a_row["seeds"] == [0] and b_row["seeds"] == [] and b_row["time_to_level_s"] is None
    table = (out / "race.md").read_text()
    assert f"**Partial:** {partial}." in table and "| b | not reached |" in table
    assert "(partial: the race did not finish)" in (out / "race.svg").read_text()
    assert (out / ".race.lock").read_text() == f"{proc.pid}\n"  # the driver's pid, for a refusal line


STUCK_TRAINER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a trainer deep in a long step: SIGTERM does not stop it
worker = subprocess.Popen(  # a torchrun worker: a session of its own, out of the trainer's process group
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True,
)
print(worker.pid, flush=True)
time.sleep(600)
"""


def test_the_watchdogs_kill_list_is_the_trainers_tree_and_nothing_else():
    """What the watchdog SIGKILLs at the end: the trainers' groups and their descendants, never anything
    else (no group: nothing; never init, never itself)."""
    source = heats._WATCHDOG
    scope: dict = {"os": os}
    exec(source[source.index("def descendants") : source.index("def send")], scope)
    descendants = scope["descendants"]
    assert descendants(set()) == set() and descendants({1}) == set()
    trainer = subprocess.Popen(
        [sys.executable, "-c", STUCK_TRAINER], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    try:
        worker = int(trainer.stdout.readline())
        assert descendants({trainer.pid}) == {trainer.pid, worker}
    finally:
        trainer.kill()
        trainer.wait()
        os.kill(worker, signal.SIGKILL)


def test_the_watchdog_kills_a_stuck_trainer_and_its_workers_in_sessions_of_their_own():
    dog = heats._Watchdog()
    trainer = subprocess.Popen(
        [sys.executable, "-c", STUCK_TRAINER], start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    try:
        worker = int(trainer.stdout.readline())
        dog.watch(trainer.pid)
        dog.proc.stdin.close()  # what the watchdog sees when the driver dies: its input ends
        gone = time.time()
        trainer.wait(timeout=300)  # a hang guard: the time it takes is not asserted (a busy machine)
        assert wait_for(lambda: not pid_alive(worker), timeout=300)
        assert not group_alive(trainer.pid)
        # SIGTERM first (which the stuck trainer ignores), SIGKILL no sooner than the grace after it
        assert trainer.returncode == -signal.SIGKILL and time.time() - gone >= race.ORPHAN_GRACE_S - 0.5
        assert dog.proc.wait(timeout=5) == 0
    finally:
        trainer.kill()
        trainer.wait()


HOLDER = """
import json, os, sys, time
from pathlib import Path
from jagg_engine import race
race.claim_out(Path(sys.argv[1]), {**json.loads(sys.argv[2]), "driver": {"pid": os.getpid()}})
print("held", flush=True)
time.sleep(600)
"""


def test_a_race_whose_driver_is_gone_reads_interrupted_and_a_live_one_is_left_alone(tmp_path):
    out = tmp_path / "race"
    out.mkdir()
    plan = {"variants": [{"name": "a"}, {"name": "b"}], "seeds": [0], "runs": [], "status": "running"}
    holder = subprocess.Popen(  # a live driver: it holds the folder's lock
        [sys.executable, "-c", HOLDER, str(out), json.dumps(plan)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert race.driver_gone(out) is None
        assert race.check_runs_folder(out / "runs") is None
        assert json.loads((out / "race.json").read_text())["status"] == "running"
    finally:
        holder.kill()
        holder.wait()
    line = race.check_runs_folder(out / "runs")  # the lock went with its process
    assert line == f"race {out}: interrupted: its driver (pid {holder.pid}) is gone"
    assert json.loads((out / "race.json").read_text())["status"] == "interrupted"
    assert race.driver_gone(out) is None  # said once; it stays interrupted
    open_store(out / "runs").close()
    rep = jagg("race", "--report-only", "--out", str(out))  # nothing finished: one line, no table
    assert rep.returncode == 1 and rep.stderr.strip().splitlines() == [
        f"jagg race: error: the race is interrupted (its driver (pid {holder.pid}) is gone): 0 of 2 planned"
        " runs finished; variant 'a': the baseline has no finished run with an eval to race against"
    ]

    # A race.json of before the lock file: its driver's pid decides.
    old = tmp_path / "old"
    old.mkdir()
    (old / "race.json").write_text(json.dumps({**plan, "driver": {"pid": os.getpid()}}))
    assert race.driver_gone(old) is None  # this process: alive
    (old / "race.json").write_text(json.dumps({**plan, "driver": {"pid": holder.pid}}))
    assert race.driver_gone(old).endswith(f"its driver (pid {holder.pid}) is gone")


# ------------------------------------------------------------------------------------------------ one --out

CLAIMER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from jagg_engine import race
    from jagg_engine.errors import UsageError
    root, tries, t0 = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for i in range(tries):
        out = root / f"try{i:02d}"
        out.mkdir(exist_ok=True)
        while time.time() < t0 + 0.5 * i:  # both processes claim at the same instant
            pass
        try:
            fd = race.claim_out(out, {"status": "running", "driver": {"pid": os.getpid()}, "runs": []})
        except UsageError as exc:
            print("refused", i, exc, flush=True)
            continue
        print("claimed", i, flush=True)
        time.sleep(0.3)  # the race runs, holding its folder
        os.close(fd)
    """
)


def test_two_races_claiming_one_out_at_the_same_instant_exactly_one_wins_20_of_20(tmp_path):
    tries = 20
    t0 = time.time() + 3.0  # after both interpreters have imported jagg_engine.race
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(tmp_path), str(tries), str(t0)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    per_try: dict[int, list[tuple[int, str]]] = {}
    for who, (text, _) in enumerate(outputs):
        for line in text.splitlines():
            verdict, i, *rest = line.split(" ", 2)
            per_try.setdefault(int(i), []).append((who, verdict, *rest))
    assert sorted(per_try) == list(range(tries))
    for i, answers in per_try.items():
        assert sorted(a[1] for a in answers) == ["claimed", "refused"], (i, answers)
        winner = next(a[0] for a in answers if a[1] == "claimed")
        refusal = next(a[2] for a in answers if a[1] == "refused")
        out = tmp_path / f"try{i:02d}"
        assert refusal in (
            f"--out: {out}: another jagg race runs in it (pid {procs[winner].pid}); not started",
            f"--out: {out} holds a race already (race.json); give a new folder, or --report-only",
        )
        assert json.loads((out / "race.json").read_text())["driver"]["pid"] == procs[winner].pid


@pytest.mark.slow
def test_two_jagg_race_commands_started_together_into_one_out_one_runs_the_other_is_one_line(tmp_path):
    out = tmp_path / "race"
    args = [
        "race", "--variant", "a:strategy=exact", "--variant", "b:strategy=jagg", "--seeds", "0",
        "--out", str(out), "--threads", "1", "steps=2", *TINY,
    ]  # fmt: skip
    procs = [jagg(*args, wait=False) for _ in range(2)]
    results = [(p, *p.communicate(timeout=900)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    winner = next(p for p, _, _ in results if p.returncode == 0)
    _, _, err = next(r for r in results if r[0].returncode == 2)
    assert err.strip().splitlines()[-1] in (
        f"jagg race: error: --out: {out}: another jagg race runs in it (pid {winner.pid}); not started",
        f"jagg race: error: --out: {out} holds a race already (race.json); give a new folder, or --report-only",
    )
    plan = json.loads((out / "race.json").read_text())
    assert plan["status"] == "finished" and plan["driver"]["pid"] == winner.pid
    assert [(r["variant"], r["seed"]) for r in plan["runs"]] == [("a", 0), ("b", 0)]
    store = open_store(out / "runs")
    assert {r["id"] for r in store.list_runs()} == {r["run_id"] for r in plan["runs"]}  # no other race's run
    store.close()
