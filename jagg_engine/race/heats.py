"""Running the heats: trainers started side by side (or one after the other), a watchdog that outlives
the driver so that no trainer does, Ctrl-C and a failed run stopping them all."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jagg_engine.errors import UsageError
from jagg_engine.processes import (
    SIDE_BY_SIDE,
    THREAD_VARS,
    PairPlan,
    gpu_present,
    kill_group,
    train_command,
    usable_cores,
)
from jagg_engine.store import RunStore, StoreError, open_store

from .folder import _write_atomic, claim_out
from .plan import RACE_JSON, RaceError, Variant, check_variants, schedule
from .report import report

# ------------------------------------------------------------------------------------------------ running


POLL_S = 1.0
STOP_GRACE_S = 300.0  # how long a cooperative stop may take (one training step) before the runs are killed
ORPHAN_GRACE_S = (
    5.0  # a driver gone: its runs get SIGTERM, then SIGKILL this long after (no trainer outlives it)
)


class _Stop(Exception):
    """SIGTERM to the race: handled as Ctrl-C."""


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="race", unit="step", file=sys.stderr, dynamic_ncols=True)


# The trainer's first instructions, before it becomes `jagg train` (os.execv keeps the pid and the setting):
# SIGTERM when the race's driver dies (Linux PR_SET_PDEATHSIG = 1), or exit at once if it died already.
# Set here, not in a preexec_fn, which is unsafe in a process with threads (tqdm's monitor).
_WITH_PARENT = """
import os, sys
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""

# The watchdog: reads "+PGID" / "-PGID" lines from the driver (a trainer's process group started / ended).
# End of input means the driver is gone (or done): SIGTERM to every group left (each trainer finishes its
# step, saves and reads cancelled), then, ORPHAN_GRACE_S later, SIGKILL to those groups and to every process
# that descended from them at that first moment (found from /proc's parent pids: torchrun's workers of a
# `--processes N` trainer live in sessions of their own, out of the trainer's group).
_WATCHDOG = """
import os, signal, sys, time
groups = set()
for line in sys.stdin:
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
def descendants(groups):
    children, members = {}, []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
            if int(fields[2]) in groups:
                members.append(int(entry))
    found, todo = set(), [g for g in groups if g > 1] + members
    while todo:
        pid = todo.pop()
        if pid > 1 and pid != os.getpid() and pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found
def send(targets, sig, kill=os.killpg):
    for t in list(targets):
        try:
            kill(t, sig)
        except (ProcessLookupError, PermissionError):
            targets.discard(t)
tree = descendants(groups)
if groups:
    print(f"jagg race: its driver is gone; stopping {len(groups)} run(s)", file=sys.stderr, flush=True)
send(groups, signal.SIGTERM)
deadline = time.time() + float(sys.argv[1])
while (groups or tree) and time.time() < deadline:
    time.sleep(0.1)
    send(groups, 0)
    send(tree, 0, os.kill)
send(groups, signal.SIGKILL)
send(tree, signal.SIGKILL, os.kill)
"""


class _Watchdog:
    """A process of its own (own session: a Ctrl-C or a kill of the driver's group does not reach it) that
    outlives the driver only to stop the driver's trainers: no trainer of a race outlives its driver, even
    one killed with SIGKILL, and with them every process a trainer started (its process group)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(ORPHAN_GRACE_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        try:
            self._say(f"+{pgid}")
        except (OSError, ValueError) as exc:  # the watchdog is gone (killed): the parent-death signal remains
            print(
                f"jagg race: warning: its watchdog is gone ({type(exc).__name__}); the trainers still stop"
                " when the race ends, by their parent-death signal",
                file=sys.stderr,
                flush=True,
            )

    def forget(self, pgid: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._say(f"-{pgid}")

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=ORPHAN_GRACE_S + 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _start(
    store: RunStore, runs_dir: Path, cfg: Any, env: Mapping[str, str], watchdog: _Watchdog
) -> tuple[int, subprocess.Popen]:
    """Create the run (queued, this process as its starter) and start ``jagg train --run-id`` for it in its own
    process group, its output to ``<run_dir>/stdout.log``. The trainer dies with the race: SIGTERM from the
    kernel when this process dies (PR_SET_PDEATHSIG), and its group is the watchdog's to kill."""
    run_id = store.create_run(cfg.name, cfg.to_dict(), None, launcher="cli", pid=os.getpid())
    run_dir = runs_dir / f"run-{run_id:04d}"  # as `jagg train` names it
    run_dir.mkdir(parents=True, exist_ok=True)
    store.set_run_dir(run_id, run_dir)
    with (run_dir / "stdout.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WITH_PARENT, str(os.getpid()), *train_command(run_id, runs_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the race only; it stops the runs itself
            env=dict(env),
        )
    watchdog.watch(proc.pid)
    return run_id, proc


def _stop(store: RunStore, procs: Mapping[int, subprocess.Popen], grace: float) -> None:
    """Stop the runs: SIGTERM to each process group (the trainer finishes its step, saves a checkpoint and
    marks the run cancelled), up to ``grace`` seconds, then (or at a second Ctrl-C) SIGKILL; runs left
    active are marked cancelled."""
    live = {run_id: p for run_id, p in procs.items() if p.poll() is None}
    for p in live.values():
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    if live:
        print(
            f"jagg race: stopping {len(live)} run(s) after their current step (Ctrl-C again kills them now)",
            file=sys.stderr,
            flush=True,
        )
    deadline = time.time() + grace
    try:
        while time.time() < deadline and any(p.poll() is None for p in live.values()):
            time.sleep(0.2)
    except (KeyboardInterrupt, _Stop):
        pass
    for p in live.values():
        if p.poll() is None:
            kill_group(p.pid, grace=0.0)
            p.wait()
    for run_id in procs:
        run = store.get_run(run_id)
        if run is not None and run["status"] in ("queued", "running"):
            try:
                store.set_status(run_id, "cancelled", error="stopped by jagg race")
            except StoreError:
                pass


def _run_heat(
    store: RunStore,
    runs_dir: Path,
    heat: Sequence[tuple[str, Any]],
    plan: PairPlan,
    record: Any,
    bar: Any,
    done_before: int,
    watchdog: _Watchdog,
) -> None:
    """Train one heat (the variants of one seed): all at once side by side, else one after the other. A run
    that fails stops the others and raises RaceError naming it."""
    env = dict(os.environ)
    if plan.mode == SIDE_BY_SIDE and plan.threads > 0:
        env.update(dict.fromkeys(THREAD_VARS, str(plan.threads)))
    groups = [list(heat)] if plan.mode == SIDE_BY_SIDE else [[item] for item in heat]
    for group in groups:
        procs: dict[int, subprocess.Popen] = {}
        names: dict[int, str] = {}
        try:
            for name, cfg in group:
                run_id, proc = _start(store, runs_dir, cfg, env, watchdog)
                procs[run_id], names[run_id] = proc, name
                record(name, cfg.seed, run_id)
            started = ", ".join(f"{names[r]} run {r} (pid {p.pid})" for r, p in procs.items())
            bar.write(f"seed {group[0][1].seed}: {started}", file=sys.stderr)
            while True:
                steps = {r: max(0, int(store.get_run(r)["last_step"] or 0)) for r in procs}
                if done_before + sum(steps.values()) != bar.n:  # a line per step, also into a log file
                    bar.set_postfix_str(", ".join(f"{names[r]} {steps[r]}" for r in procs), refresh=False)
                    bar.update(done_before + sum(steps.values()) - bar.n)
                for run_id, proc in procs.items():
                    code = proc.poll()
                    if code not in (None, 0) or (code == 0 and store.get_run(run_id)["status"] != "finished"):
                        run = store.get_run(run_id)
                        reason = (run.get("error") or f"exit code {code}").splitlines()[0]
                        _stop(store, procs, STOP_GRACE_S)
                        raise RaceError(
                            f"variant {names[run_id]!r} seed {run['config']['seed']} (run {run_id}) ended"
                            f" {run['status']}: {reason} (log: {run['run_dir']}/train.log)"
                        )
                if all(p.poll() is not None for p in procs.values()):
                    break
                time.sleep(POLL_S)
            done_before += sum(int(cfg.steps) for _, cfg in group)
        except BaseException:  # Ctrl-C, SIGTERM, a failed run, or an error of the race itself: no orphans
            _stop(store, procs, STOP_GRACE_S)
            raise
        finally:
            for proc in procs.values():
                if proc.poll() is not None:
                    watchdog.forget(proc.pid)


def race(
    config: str | None,
    common: Sequence[str],
    variants: Sequence[Variant],
    seeds: Sequence[int],
    out: Path,
    threads: int | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Validate every variant, then train the heats and write the report (see the module docstring)."""
    from jagg_engine.train.config import ConfigError, check_runs_dir

    configs = check_variants(config, common, variants, seeds)
    try:
        check_runs_dir(out, "--out")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    plan_ = schedule(configs, len(variants), threads)
    runs_dir = out / "runs"
    plan: dict[str, Any] = {
        "command": command,
        "config": config,
        "overrides": list(common),
        "variants": [{"name": v.name, "overrides": list(v.overrides)} for v in variants],
        "seeds": list(seeds),
        "machine": {"cores": usable_cores(), "gpu": gpu_present()},
        "schedule": {"mode": plan_.mode, "threads": plan_.threads, "reason": plan_.reason},
        "runs": [],
        "status": "running",
        "driver": {"pid": os.getpid(), "started_at": time.time()},
    }
    lock = claim_out(out, plan)  # held until this process ends: one race per folder
    try:
        return _race(out, runs_dir, plan, plan_, configs, variants, seeds)
    finally:
        os.close(lock)


def _race(
    out: Path,
    runs_dir: Path,
    plan: dict[str, Any],
    plan_: PairPlan,
    configs: Mapping[tuple[str, int], Any],
    variants: Sequence[Variant],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Train the heats of a claimed race folder and write the report."""
    runs_dir.mkdir(parents=True, exist_ok=True)

    def record(name: str, seed: int, run_id: int) -> None:
        plan["runs"].append({"variant": name, "seed": seed, "run_id": run_id})
        _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))

    print(
        f"jagg race: {len(variants)} variants × {len(seeds)} seeds in {out}; {plan_.mode} ({plan_.reason});"
        f" baseline {variants[0].name}",
        file=sys.stderr,
        flush=True,
    )
    watchdog = _Watchdog()
    plan["driver"]["watchdog_pid"] = watchdog.proc.pid  # in race.json from the first run on
    store = open_store(runs_dir)
    bar = _progress(sum(int(cfg.steps) for cfg in configs.values()))
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    done = 0
    try:
        for seed in seeds:
            heat = [(v.name, configs[(v.name, seed)]) for v in variants]
            _run_heat(store, runs_dir, heat, plan_, record, bar, done, watchdog)
            done += sum(int(cfg.steps) for _, cfg in heat)
    except (KeyboardInterrupt, _Stop):
        plan["status"] = "interrupted"
        _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
        raise KeyboardInterrupt from None
    except BaseException as exc:  # a run that failed, or an error of the race itself (its runs are stopped)
        plan["status"] = "failed"
        if not isinstance(exc, RaceError):
            plan["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        watchdog.close()
        bar.close()
        store.close()
    plan["status"] = "finished"
    return report(out, plan)[0]
