"""Record the app's showcase again: an exact run and a JAGG run of configs/tiny-shapes-cpu.yaml, then pack
their history (metrics, probes, eval images; no checkpoint or log) into assets/showcase/.

    python scripts/record_showcase.py [--steps N] [--runs-dir DIR] [--out assets/showcase]
    python scripts/record_showcase.py --pack-only DIR [--steps N]     # pack runs already recorded in DIR

The two runs are ``jagg train configs/tiny-shapes-cpu.yaml strategy=S name=showcase-S [steps=N]
--runs-dir DIR`` for S = exact and jagg: the same config, seed, prompts and eval seeds. They are started
together with one intra-op thread each (OMP_NUM_THREADS=1), so that they share the machine alike and their
update times are comparable. ``--steps`` (default: the config's 40) shortens both.
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


def record(runs_dir: Path, steps: int | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = []
    for strategy in STRATEGIES:
        argv = [sys.executable, "-m", "jagg_engine.cli", "train", CONFIG, f"strategy={strategy}"]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="GRPO steps of both runs (default: the config's)")
    p.add_argument("--runs-dir", type=Path, default=None, help="where to record (default: a new temp folder)")
    p.add_argument("--pack-only", type=Path, default=None, metavar="DIR", help="pack runs recorded in DIR")
    p.add_argument("--out", type=Path, default=showcase.SHOWCASE_DIR, help="showcase folder to (re)write")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps: must be an integer >= 1, got {args.steps}")
    command = "python scripts/record_showcase.py" + (f" --steps {args.steps}" if args.steps else "")
    if args.pack_only is not None:
        runs_dir = args.pack_only
    else:
        runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="jagg-showcase-"))
        record(runs_dir, args.steps)
    ids = latest_runs(runs_dir)
    with open_store(runs_dir) as store:
        manifest = showcase.pack(store, ids, args.out, recorded_with=command)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"showcase: runs {ids} of {runs_dir} → {manifest.parent} ({size / 1024**2:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
