"""Record the app's showcase again: Flow-GRPO's exact backward over the whole SDE range against the shipped
default (the first W = 4 steps by JAGG + reuse, DPM-Solver++ after them) of configs/tiny-shapes-cpu.yaml, then
pack their history (metrics, probes, eval images; no checkpoint or log) and the JAGG run's aligned model (the
folder `jagg export-model` writes, for the Try it tab) into assets/showcase/.

    python scripts/record_showcase.py [--steps N] [--runs-dir DIR] [--out assets/showcase]
    python scripts/record_showcase.py --pack-only DIR [--runs exact=ID,jagg=ID] [--max-step N]

The two runs are ``jagg train configs/tiny-shapes-cpu.yaml eval_every=5 name=showcase-S [steps=N] --runs-dir
DIR``, the exact one with ``EXACT`` on top (variant (a) of README "Time to quality"): the same seed, prompts and
eval seeds. They are started together with one intra-op thread each (OMP_NUM_THREADS=1), so that they share
the machine alike and their times are comparable. ``--steps`` (default: the config's 40) shortens both.

``--pack-only DIR`` packs runs already recorded in DIR: the newest finished showcase-exact and showcase-jagg,
or the ids ``--runs`` names (e.g. a race's (a) and default runs of one seed); ``--max-step N`` keeps their first N
steps (a longer run's first N steps are those of an N-step run: the schedule is a function of the step).
Eval images are shipped every ``--image-every`` steps (default 20, plus the first and last eval) so that the
showcase's images stay under 3 MB; every eval metric is shipped. The JAGG run's model is exported from its
checkpoint at the last packed step (``jagg export-model ID --step N``; the race's runs need
``checkpoint_every`` to hit that step) and shipped under ``models/jagg/``; ``--no-model`` ships none.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app import showcase  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402

CONFIG = "configs/tiny-shapes-cpu.yaml"
STRATEGIES = ("exact", "jagg")
# Variant (a): exact over the whole SDE range (steps 0-7), every sample its own noise, Euler outside it
# (Flow-GRPO).
EXACT = ["strategy=exact", "sde_window_end=8", "sde_window_schedule=fixed", "group_noise=independent"]
EXACT += ["ode_solver=euler", "ode_steps_after=null"]


def record(runs_dir: Path, steps: int | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = []
    for strategy in STRATEGIES:
        argv = [sys.executable, "-m", "jagg_engine.cli", "train", CONFIG, "eval_every=5"]
        argv += EXACT if strategy == "exact" else ["strategy=jagg"]
        argv += [
            f"name=showcase-{strategy}",
            *([f"steps={steps}"] if steps else []),
            "--runs-dir",
            str(runs_dir),
        ]
        print("+", " ".join(argv[1:]), flush=True)
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"record_showcase: a training run failed (exit codes {codes})")


def latest_runs(runs_dir: Path) -> dict[str, int]:
    """The newest finished showcase-exact and showcase-jagg runs of ``runs_dir``."""
    with open_store(runs_dir) as store:
        runs = store.list_runs()  # newest first
    found = {}
    for strategy in STRATEGIES:
        match = next(
            (r for r in runs if r["name"] == f"showcase-{strategy}" and r["status"] == "finished"), None
        )
        if match is None:
            raise SystemExit(f"record_showcase: no finished run named showcase-{strategy} in {runs_dir}")
        found[strategy] = match["id"]
    return found


def parse_runs(p: argparse.ArgumentParser, spec: str) -> dict[str, int]:
    """``exact=ID,jagg=ID`` → {"exact": ID, "jagg": ID}; anything else is a one-line usage error."""
    try:
        ids = {key: int(value) for key, value in (part.split("=", 1) for part in spec.split(","))}
    except ValueError:
        ids = {}
    if list(ids) != list(STRATEGIES):
        p.error(f"--runs: must be exact=ID,jagg=ID, got {spec!r}")
    return ids


def export_model(runs_dir: Path, run_id: int, step: int | None, folder: Path) -> Path:
    """``jagg export-model`` of run ``run_id`` at ``step`` (None: its last checkpoint) into ``folder/model``."""
    out = folder / "model"
    argv = [sys.executable, "-m", "jagg_engine.cli", "export-model", str(run_id), "--out", str(out)]
    argv += [*(["--step", str(step)] if step is not None else []), "--runs-dir", str(runs_dir)]
    print("+", " ".join(argv[1:]), flush=True)
    if subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).returncode:
        raise SystemExit(f"record_showcase: could not export run {run_id}'s model (see above)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="GRPO steps of both runs (default: the config's)")
    p.add_argument("--runs-dir", type=Path, default=None, help="where to record (default: a new temp folder)")
    p.add_argument("--pack-only", type=Path, default=None, metavar="DIR", help="pack runs recorded in DIR")
    p.add_argument("--out", type=Path, default=showcase.SHOWCASE_DIR, help="showcase folder to (re)write")
    p.add_argument("--runs", default=None, metavar="exact=ID,jagg=ID", help="with --pack-only: the run ids")
    p.add_argument("--max-step", type=int, default=None, help="with --pack-only: keep steps 0..N")
    p.add_argument("--image-every", type=int, default=20, help="eval images every k steps (default 20)")
    p.add_argument("--no-model", action="store_true", help="ship no model (Try it then has none to show)")
    p.add_argument("--recorded-with", default=None, help="with --pack-only: the command that recorded them")
    args = p.parse_args(argv)
    for name in ("steps", "max_step", "image_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')}: must be an integer >= 1, got {value}")
    if args.pack_only is None and (args.runs or args.max_step or args.recorded_with):
        p.error("--runs, --max-step and --recorded-with go with --pack-only")
    command = "python scripts/record_showcase.py" + (f" --steps {args.steps}" if args.steps else "")
    if args.pack_only is not None:
        runs_dir = args.pack_only
        command = args.recorded_with or command
    else:
        runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="jagg-showcase-"))
        record(runs_dir, args.steps)
    ids = parse_runs(p, args.runs) if args.runs else latest_runs(runs_dir)
    with tempfile.TemporaryDirectory(prefix="jagg-showcase-model-") as tmp:
        models = (
            {} if args.no_model else {"jagg": export_model(runs_dir, ids["jagg"], args.max_step, Path(tmp))}
        )
        with open_store(runs_dir) as store:
            manifest = showcase.pack(
                store, ids, args.out, recorded_with=command, max_step=args.max_step,
                image_every=args.image_every, models=models,
            )  # fmt: skip
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"showcase: runs {ids} of {runs_dir} → {manifest.parent} ({size / 1024**2:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
