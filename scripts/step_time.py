"""Whole training step time of a config against a baseline, side by side at equal load.

    python scripts/step_time.py configs/tiny-shapes-cpu.yaml --baseline strategy=exact --steps 10

Starts two `jagg train` processes at once, one thread each (OMP/MKL threads 1): the config as shipped (plus
any ``--set key=value``) and the same with the ``--baseline`` overrides. No eval, no sample images, no probes;
the run folders go to a temporary directory. Only steps that both processes shared the machine for count:
when the first run has done its ``--steps``, the other is stopped (SIGTERM, after its current step, which is
left out). Reports, per run, the median over its counted steps from step 2 on (step 1 pays one-off warm-up)
of time/step, time/sampling, time/reward and time/update, and the ratios config / baseline. A load change
hits both processes alike; the figure to quote is the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ("time/step", "time/sampling", "time/reward", "time/update", "count/reused")
QUIET = ["eval_every=0", "sample_every=0", "probe_every=0", "checkpoint_every=0"]


def _steps_logged(runs_dir: Path) -> int:
    from jagg_engine.store import open_store

    runs = open_store(runs_dir).list_runs()
    frame = open_store(runs_dir).metrics_frame(runs[0]["id"]) if runs else None
    return 0 if frame is None or frame.empty else int(frame.step.max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--baseline", nargs="+", default=["strategy=exact"], help="overrides of the baseline run")
    p.add_argument("--set", nargs="*", default=[], help="overrides of both runs")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write results.json here")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps: must be at least 2 (step 1 is left out as warm-up)")

    from jagg_engine.store import open_store

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    runs = {"config": [], "baseline": list(args.baseline)}
    with tempfile.TemporaryDirectory(prefix="jagg-step-time-") as tmp:
        procs = {}
        for name, extra in runs.items():
            overrides = [f"steps={args.steps}", f"name=step-time-{name}", *QUIET, *args.set, *extra]
            cmd = [sys.executable, "-m", "jagg_engine.cli", "train", args.config, *overrides]
            cmd += ["--runs-dir", str(Path(tmp) / name)]
            log = open(Path(tmp) / f"{name}.log", "w")  # noqa: SIM115 (closed with the folder)
            procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        counted = {}  # run → the last step that finished while both processes ran
        while len(counted) < 2:
            time.sleep(2)
            for name, proc in procs.items():
                if name not in counted and proc.poll() is not None:
                    if proc.returncode != 0:
                        err = (Path(tmp) / f"{name}.log").read_text()[-3000:]
                        print(f"{name} run failed:\n{err}", file=sys.stderr)
                        for other in procs.values():
                            if other.poll() is None:
                                other.kill()
                        return 1
                    counted[name] = args.steps
                    for other, other_proc in procs.items():
                        if other not in counted:
                            counted[other] = _steps_logged(Path(tmp) / other)
                            other_proc.send_signal(signal.SIGTERM)  # cancel after its current step
                            other_proc.wait()
        results = {}
        for name in runs:
            store = open_store(Path(tmp) / name)
            (run,) = store.list_runs()
            frame = store.metrics_frame(run["id"])
            later = frame[(frame.step >= 2) & (frame.step <= counted[name])]
            results[name] = {
                k: statistics.median(later[k].dropna()) for k in KEYS if k in later and len(later)
            }
            results[name]["steps"] = f"2..{counted[name]}"
    ratio = {k: results["config"][k] / results["baseline"][k] for k in KEYS[:4] if results["baseline"].get(k)}
    report = {
        "command": " ".join(["python scripts/step_time.py", *(argv if argv is not None else sys.argv[1:])]),
        "baseline_overrides": args.baseline,
        "medians": results,
        "ratio_config_over_baseline": ratio,
        "less_time_per_step": 1 - ratio["time/step"],
    }
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
