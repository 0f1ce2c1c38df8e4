"""Run lifecycle for the app: create, queue, launch as a subprocess, cancel, and re-attach after a restart.

The database is the source of truth, so nothing here needs to survive the app process:

* A run is created ``queued`` with its validated config (``store.create_run_folder``, launcher ``app``) in a
  NEW folder ``<runs_dir>/run-<id>`` (never one that exists); it has no pid until it is launched. The app
  starts only runs it queued itself: a run that ``jagg train`` created in the same folder (launcher ``cli``, pid set at creation) is
  never taken for an unlaunched one, however long its model takes to load.
* :meth:`RunManager.tick` (driven by the app's timer) marks dead runs failed (``check_liveness``), reaps
  finished children, escalates overdue cancels, and starts queued runs without a pid, oldest first, while
  fewer than ``max_concurrent`` runs are active. A restarted app reads the same rows and carries on.
* A launched run is ``[python, -m, jagg_engine.cli, train, --run-id, ID, --runs-dir, DIR]`` in its own
  session (so its own process group), stdout/stderr appended to ``<run_dir>/stdout.log``. It outlives the
  app and browser reloads. The trainer sets running / finished / failed / cancelled itself.
* Resume (:meth:`RunManager.resume`) starts a failed or cancelled run again as ``jagg train --resume ID``
  (from its last checkpoint) when a slot is free; the trainer marks it running.
* One trainer per run: an app takes a queued run with a compare-and-set of its pid
  (``store.claim_launch``: the app's pid, then its child's), so several apps on one runs folder never start a
  run twice; Resume is refused while this app's resume of the run is starting or another process holds the
  run folder's lock (:class:`jagg_engine.store.RunLock`), and the resumed trainer records its own pid, so a
  refused one never stands for the run.
* A compare pair (:meth:`RunManager.create_pair`: exact and jagg, same config, prompts and seeds) runs side by
  side on a CPU machine with at least two cores per training process (:func:`plan_pair`): both runs start in the
  same tick or neither does, the cores are split evenly between their processes as torch threads
  (``OMP_NUM_THREADS``), and the pair takes ONE slot of ``max_concurrent`` (together it loads the CPU as one run
  with every core would). Each run keeps its share of the cores from its first step to its last, so both are
  timed under the same load, also after the faster one has finished. On a GPU machine, or with too few cores,
  the pair runs one after the other, exact first: the second starts when the first has ended, even if
  ``max_concurrent`` leaves a slot free. The mode is kept on both runs (``runs.pair_mode``) and
  :meth:`RunManager.pair_message` says which one the app used.
* Delete (:meth:`RunManager.delete`) is refused while the run trains, while this app's resume of it starts,
  and while any trainer holds its folder's lock: no trainer outlives its run's row.
* Cancel is cooperative first (``store.request_cancel``; the trainer stops within one step: before the
  update of a step whose rollout it was asked during, or before the eval of one it updated; saves, marks cancelled); a run still alive ``cancel_timeout`` seconds later has its process group sent SIGTERM, then
  SIGKILL, and is marked cancelled.

No torch here: this module only starts and watches processes.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jagg_engine.processes import (  # noqa: F401 (the app's names for them)
    KILL_GRACE_S,
    SEQUENTIAL,
    SIDE_BY_SIDE,
    THREAD_VARS,
    PairPlan,
    gpu_present,
    group_alive,
    kill_group,
    plan_pair,
    train_command,
    train_resume_command,
    usable_cores,
)
from jagg_engine.store import ClaimError, RunLock, RunStore, StoreError, open_store, pid_alive

CommandFactory = Callable[[int, Path], list[str]]


class RunManager:
    """Creates, starts, queues and cancels runs of one runs folder. Thread-safe; one per app process."""

    def __init__(
        self,
        runs_dir: str | os.PathLike[str],
        command: CommandFactory = train_command,
        max_concurrent: int = 1,
        cancel_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        resume_command: CommandFactory = train_resume_command,
        cores: int | None = None,
        gpu: bool | None = None,
    ):
        """``cores`` and ``gpu`` describe the machine for compare pairs (:func:`plan_pair`); None: detected."""
        self.runs_dir = Path(runs_dir).resolve()
        if not self.runs_dir.is_dir():
            self.runs_dir.mkdir(parents=True)
        self.store: RunStore = open_store(self.runs_dir)
        self.command = command
        self.resume_command = resume_command
        self.max_concurrent = max_concurrent
        self.cancel_timeout = cancel_timeout
        self.env = dict(env) if env is not None else None
        self.cores = usable_cores() if cores is None else cores
        self.gpu = gpu_present() if gpu is None else gpu
        self._children: dict[int, subprocess.Popen] = {}  # run_id → process started by this app process
        self._cancel_deadline: dict[int, float] = {}  # run_id → when to stop waiting for a cooperative stop
        self._resuming: set[int] = set()  # resumed here, not yet marked running by their trainer
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ create / queue
    def create(self, config: Mapping[str, Any], paired_run_id: int | None = None) -> int:
        """Insert a queued run with a validated config (TrainConfig.to_dict()) and make its folder."""
        config = dict(config)
        with self._lock:  # a new folder run-<id>, as `jagg train` names it; never an existing one
            run_id, _ = self.store.create_run_folder(
                str(config.get("name", "run")), config, paired_run_id, launcher="app"
            )
        return run_id

    def pair_plan(self, config: Mapping[str, Any]) -> PairPlan:
        """How a compare pair of ``config`` runs on this machine (:func:`plan_pair`)."""
        return plan_pair(int(config.get("processes") or 1), self.cores, self.gpu)

    def create_pair(self, config: Mapping[str, Any]) -> tuple[int, int]:
        """Two runs with the same config, prompts and seeds, exact then jagg, linked both ways by
        paired_run_id, with the pair mode of :meth:`pair_plan` on both. Side by side, the queue starts them
        together; sequential, in that order (the exact run trains first)."""
        base = dict(config)
        name = str(base.get("name", "run"))
        mode = self.pair_plan(base).mode
        with self._lock:  # no tick between the two inserts: it would start the exact run alone
            exact_id = self.create({**base, "strategy": "exact", "name": f"{name}-exact"})
            jagg_id = self.create(
                {**base, "strategy": "jagg", "name": f"{name}-jagg"}, paired_run_id=exact_id
            )
            self.store.set_paired(exact_id, jagg_id)
            self.store.set_pair_mode(exact_id, mode)
            self.store.set_pair_mode(jagg_id, mode)
        return exact_id, jagg_id

    def pair_message(self, exact_id: int, jagg_id: int) -> str:
        """The line the app shows after queueing a pair: which mode it uses and why, and whether it started."""
        exact, jagg = self.store.get_run(exact_id), self.store.get_run(jagg_id)
        if exact is None or jagg is None:
            raise StoreError(f"no pair of runs {exact_id} and {jagg_id}")
        plan = self.pair_plan(exact["config"])
        same = "same config, prompts and seeds"
        if exact.get("pair_mode") == SIDE_BY_SIDE:
            started = exact["pid"] is not None and jagg["pid"] is not None
            when = "started together" if started else "queued; they start together when the runs ahead finish"
            return (
                f"Pair side by side: exact #{exact_id} and JAGG #{jagg_id} {when} ({same}; {plan.reason}),"
                " so both are timed under the same load."
            )
        return (
            f"Pair one after the other: exact #{exact_id}, then JAGG #{jagg_id} ({same}; {plan.reason}); the"
            " second starts when the first finishes."
        )

    def pending(self) -> list[dict[str, Any]]:
        """Runs the app queued and has not launched yet (no pid), oldest first."""
        runs = [
            r
            for r in self.store.list_runs()
            if r["status"] == "queued" and r["pid"] is None and r.get("launcher") == "app"
        ]
        return sorted(runs, key=lambda r: r["id"])

    def active(self) -> list[dict[str, Any]]:
        """Launched runs whose process is alive (queued-with-pid or running)."""
        return [
            r
            for r in self.store.list_runs()
            if r["status"] in ("queued", "running")
            and r["pid"] is not None
            and pid_alive(r["pid"], r.get("pid_at"))
        ]

    # ------------------------------------------------------------------ launch
    def start(self, run_id: int) -> int:
        """Launch a queued run now (own process group, output appended to stdout.log); returns the pid."""
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                raise StoreError(f"no run with id {run_id}")
            if run["pid"] is not None and run.get("launcher") == "app":  # launched since it was read
                raise ClaimError(f"run {run_id}: already started (pid {run['pid']}, {run['status']})")
            if run["status"] != "queued" or run["pid"] is not None or run.get("launcher") != "app":
                raise StoreError(
                    f"run {run_id}: is {run['status']} (pid {run['pid']}); only a queued run starts"
                )
            if not self.store.claim_launch(run_id, os.getpid()):  # another app took it since the read
                raise ClaimError(f"run {run_id}: another app started it")
            try:
                return self._spawn(run, self.command(run_id, self.runs_dir), claimed=True)
            except BaseException:
                self.store.replace_pid(run_id, os.getpid(), None)  # not launched: back in the queue's hands
                raise

    def _spawn(self, run: Mapping[str, Any], argv: list[str], claimed: bool) -> int:
        """Start ``argv`` for ``run`` in its own process group, output appended to its stdout.log. ``claimed``:
        the run holds this app's pid (claim_launch), handed to the child; else (a resume) the trainer records
        its own pid when it claims the run."""
        run_dir = Path(run["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / "stdout.log").open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session and process group: survives the app, killable as one
                cwd=os.getcwd(),
                env=self._env(run),
            )
        self._children[run["id"]] = proc
        if claimed:
            self.store.replace_pid(run["id"], os.getpid(), proc.pid)
        return proc.pid

    def _env(self, run: Mapping[str, Any]) -> dict[str, str] | None:
        """The environment of a run's trainer: a run of a side-by-side pair gets its share of the cores as
        torch CPU threads (also when resumed, so its timings stay comparable)."""
        if run.get("pair_mode") != SIDE_BY_SIDE:
            return self.env
        threads = max(1, self.pair_plan(run["config"]).threads)
        return {**(os.environ if self.env is None else self.env), **dict.fromkeys(THREAD_VARS, str(threads))}

    def resume(self, run_id: int) -> str:
        """Start a failed or cancelled run again from its last checkpoint, now if a slot is free (fewer than
        ``max_concurrent`` runs active); else refuse. The trainer marks it running."""
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                raise StoreError(f"no run with id {run_id}")
            if run["status"] not in ("failed", "cancelled"):
                raise StoreError(f"run {run_id}: is {run['status']}; only a failed or cancelled run resumes")
            if run_id in self.resuming():
                pid = self._children[run_id].pid
                raise ClaimError(f"run {run_id}: already resuming (pid {pid}); not started again")
            if run["run_dir"] and RunLock.held_elsewhere(run["run_dir"]):
                raise ClaimError(f"run {run_id}: another trainer holds its folder; not started again")
            busy = self._busy_slots()
            if self._slot(run) not in busy and len(busy) >= self.max_concurrent:
                raise StoreError(
                    f"run {run_id}: {len(busy)} run(s) training and at most {self.max_concurrent} at a time;"
                    " resume it when one finishes"
                )
            # A cancel deadline left from the process that ended the run must not stop the resumed one.
            self._cancel_deadline.pop(run_id, None)
            pid = self._spawn(run, self.resume_command(run_id, self.runs_dir), claimed=False)
            self._resuming.add(run_id)
            return f"run {run_id}: resuming from its last checkpoint (pid {pid})"

    def delete(self, run_id: int, delete_files: bool = False) -> bool:
        """Delete a run (:meth:`RunStore.delete_run`); refused in one line while this app's resume of it is
        starting (its trainer has not taken the run folder's lock yet), as the store refuses it once a trainer
        holds the lock or the run is active. Returns whether its folder was removed."""
        with self._lock:  # not between a resume's spawn and its record in _resuming
            if run_id in self.resuming():
                pid = self._children[run_id].pid
                raise StoreError(f"run {run_id}: is resuming (pid {pid}); cancel it first")
            return self.store.delete_run(run_id, delete_files=delete_files)

    def resuming(self) -> list[int]:
        """Runs resumed by this app whose trainer is starting (alive, not yet marked running). A trainer that
        took the run over has recorded its pid in it: once it has, the run is no longer starting, also when it
        was cancelled (or failed) again before this was asked, its process still exiting."""
        with self._lock:
            for run_id in list(self._resuming):
                proc = self._children.get(run_id)
                run = self.store.get_run(run_id)
                if (
                    proc is None
                    or proc.poll() is not None
                    or run is None
                    or run["status"] not in ("failed", "cancelled")
                    or run["pid"] == proc.pid
                ):
                    self._resuming.discard(run_id)
            return sorted(self._resuming)

    def _partner(self, run: Mapping[str, Any]) -> dict[str, Any] | None:
        """The other run of ``run``'s side-by-side pair; None when it is not in one."""
        if run.get("pair_mode") != SIDE_BY_SIDE or run.get("paired_run_id") is None:
            return None
        return self.store.get_run(run["paired_run_id"])

    def _slot(self, run: Mapping[str, Any]) -> int:
        """The slot of ``max_concurrent`` a run takes, by key: the two runs of a side-by-side pair share one."""
        partner = self._partner(run)
        return min(run["id"], partner["id"]) if partner is not None else run["id"]

    def _busy_runs(self) -> dict[int, dict[str, Any]]:
        """Active runs and runs resumed here whose trainer is starting, by id."""
        runs = {r["id"]: r for r in self.active()}
        for run_id in self.resuming():
            if run_id not in runs and (run := self.store.get_run(run_id)) is not None:
                runs[run_id] = run
        return runs

    def _busy_slots(self) -> set[int]:
        """The slots taken by active runs and by runs resumed here whose trainer is starting."""
        return {self._slot(run) for run in self._busy_runs().values()}

    @staticmethod
    def _startable(run: Mapping[str, Any]) -> bool:
        return (
            run["status"] == "queued"
            and run["pid"] is None
            and run.get("launcher") == "app"
            and not run["cancel_requested"]
        )

    def tick(self) -> list[int]:
        """One pass of the queue runner; returns the ids started. Called by the app's timer. On a read-only
        runs folder it only reaps children: the history is shown as it is."""
        with self._lock:
            if self.store.read_only:
                self._reap()
                return []
            self._reap()
            self.store.check_liveness()
            self._escalate_cancels()
            started: list[int] = []
            handled: set[int] = set()  # started together with an earlier run, or failed to start with it
            training = self._busy_runs()
            busy = {self._slot(run) for run in training.values()}
            for run in self.pending():
                if run["id"] in handled or run["cancel_requested"]:
                    continue
                if run.get("pair_mode") == SEQUENTIAL and run.get("paired_run_id") in training:
                    continue  # a sequential pair's second run waits for the first, even with a slot free
                slot = self._slot(run)
                if slot not in busy and len(busy) >= self.max_concurrent:
                    break  # oldest first: a later run does not overtake one waiting for a slot
                partner = self._partner(run)
                together = [run] + ([partner] if partner is not None and self._startable(partner) else [])
                handled.update(r["id"] for r in together)
                now = self._start_together(together)
                training.update((r["id"], r) for r in together if r["id"] in now)
                started += now
                busy.add(slot)
            return started

    def _start_together(self, runs: list[dict[str, Any]]) -> list[int]:
        """Start ``runs`` (one run, or both runs of a side-by-side pair) together or not at all; returns the
        ids started. A run whose process cannot be spawned (a missing interpreter, no memory for a process) is
        marked failed with the reason, and so is a pair partner already started, after its process group is
        killed: no half of a pair trains alone, and the queue moves on."""
        done: list[int] = []
        try:
            for run in runs:
                self.start(run["id"])
                done.append(run["id"])
        except ClaimError:
            return done  # another app on this runs folder started it: its trainer is that app's
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            for run_id in done:
                self._children.pop(run_id, None)
                kill_group(int(self.store.get_run(run_id)["pid"]), grace=0.0)
                self.store.set_status(run_id, "failed", error=f"its pair run could not start: {reason}")
            if not isinstance(exc, OSError):
                raise
            failed = runs[len(done)]["id"]
            self.store.set_status(failed, "failed", error=f"could not start the trainer: {reason}")
            return []
        return done

    # ------------------------------------------------------------------ cancel
    def cancel(self, run_id: int) -> str:
        """Stop a run: a queued run not yet launched is marked cancelled at once; a launched one is asked to
        stop (cooperative) and killed by :meth:`tick` if still alive after ``cancel_timeout`` seconds."""
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                raise StoreError(f"no run with id {run_id}")
            if run["status"] not in ("queued", "running"):
                return f"run {run_id} is already {run['status']}"
            if run["pid"] is None:
                self.store.set_status(run_id, "cancelled", error="cancelled before it started")
                return f"run {run_id} cancelled (it had not started)"
            self.store.request_cancel(run_id)
            self._cancel_deadline[run_id] = time.time() + self.cancel_timeout
            return f"run {run_id}: stop requested; killed if still running in {self.cancel_timeout:.0f} s"

    def _escalate_cancels(self) -> None:
        now = time.time()
        live = set()
        for run in self.store.list_runs():
            if run["status"] not in ("queued", "running") or run["pid"] is None:
                continue
            if run["id"] not in self._cancel_deadline and not run["cancel_requested"]:
                continue
            live.add(run["id"])
            # A cancel requested before an app restart gets a fresh deadline from now.
            deadline = self._cancel_deadline.setdefault(run["id"], now + self.cancel_timeout)
            if not run["cancel_requested"]:
                # The trainer clears the flag when it marks itself running; a cancel that came before
                # that must be asked again.
                self.store.request_cancel(run["id"])
            if now >= deadline:
                self.kill(run["id"])
        for run_id in set(self._cancel_deadline) - live:
            del self._cancel_deadline[run_id]

    def kill(self, run_id: int) -> None:
        """SIGTERM the run's process group, SIGKILL it after a grace period, and mark the run cancelled."""
        run = self.store.get_run(run_id)
        if run is None or run["pid"] is None:
            return
        pid = int(run["pid"])
        kill_group(pid)
        self._reap()
        self._cancel_deadline.pop(run_id, None)
        run = self.store.get_run(run_id)
        if run is not None and run["status"] in ("queued", "running"):
            try:
                self.store.set_status(
                    run_id, "cancelled", error="killed: did not stop after the cancel request"
                )
            except StoreError:
                pass  # the trainer reported a final status meanwhile

    def _reap(self) -> None:
        self.resuming()  # drops resumed runs whose trainer took over or exited, before their child is reaped
        for run_id, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[run_id]

    def shutdown(self) -> None:
        """Forget the children (they keep running) and close the store."""
        self._children.clear()
        try:
            self.store.close()
        except Exception:  # already closed
            pass
