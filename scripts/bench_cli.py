"""How fast the `jagg` command answers (a benchmark to run on demand, not a test: a busy machine slows every
figure here; ``tests/test_cli_torch_free.py`` asserts what is deterministic, that these commands import no torch).

    python scripts/bench_cli.py                       # 9 rounds; prints medians, writes reports/cli/bench-cli.json
    python scripts/bench_cli.py --rounds 15 --out /tmp/cli.json

Each round runs, in a fresh interpreter and in an order shuffled per round (interleaved repeats), the installed
``jagg`` entry point with ``--help``, ``runs``, ``report 1 --out r.html`` and ``reindex`` over a runs folder holding one
recorded run (written through the store, as the trainer writes one), beside two references: ``python -c pass``
(the interpreter's own start) and ``python -c "import torch"`` (what every command paid before the CLI stopped
importing torch). Prints the median, min and max wall time of each in ms, and each command's median as a ratio
of the torch import's, with the load average; writes them as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_run_folder(root: Path) -> None:
    """A runs folder with one finished run, written through the store."""
    from jagg_engine.store import open_store

    with open_store(root) as store:
        run_id, _ = store.create_run_folder("bench", {"backbone": "tiny-flux", "steps": 2}, launcher="cli")
        store.set_status(run_id, "running")
        for step in (1, 2):
            store.log_step(run_id, step, {"reward/mean": 0.5 + 0.1 * step})
        store.set_status(run_id, "finished")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9, help="interleaved repeats of every command")
    p.add_argument("--out", default=str(REPO / "reports" / "cli" / "bench-cli.json"), help="the JSON written")
    args = p.parse_args()
    jagg = shutil.which("jagg", path=str(Path(sys.executable).parent)) or shutil.which("jagg")
    if jagg is None:
        sys.exit("bench_cli: no `jagg` entry point beside this python (pip install -e . first)")
    with tempfile.TemporaryDirectory(prefix="jagg-bench-cli-") as tmp:
        runs = Path(tmp) / "runs"
        one_run_folder(runs)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "jagg --help": [jagg, "--help"],
            "jagg runs": [jagg, "runs", "--runs-dir", str(runs)],
            "jagg report 1": [
                jagg,
                "report",
                "1",
                "--runs-dir",
                str(runs),
                "--out",
                str(Path(tmp) / "r.html"),
            ],
            "jagg reindex": [jagg, "reindex", "--runs-dir", str(runs)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        rng = random.Random(0)
        for r in range(args.rounds):
            order = list(commands)
            rng.shuffle(order)
            for name in order:
                start = time.perf_counter()
                proc = subprocess.run(commands[name], env=env, capture_output=True, text=True, cwd=tmp)
                times[name].append((time.perf_counter() - start) * 1000)
                if proc.returncode != 0:
                    sys.exit(f"bench_cli: `{name}` exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    torch_ms = statistics.median(times["python -c 'import torch'"])
    figures = {
        name: {
            "median_ms": round(statistics.median(t), 1),
            "min_ms": round(min(t), 1),
            "max_ms": round(max(t), 1),
            "x_torch_import": round(statistics.median(t) / torch_ms, 3),
        }
        for name, t in times.items()
    }
    load = os.getloadavg()
    for name, f in figures.items():
        print(
            f"{name:28s} median {f['median_ms']:7.1f} ms  [{f['min_ms']:.1f} – {f['max_ms']:.1f}]"
            f"  {f['x_torch_import']:.2f}× the torch import"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {args.rounds} rounds")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "rounds": args.rounds,
        "load_average": [round(x, 2) for x in load],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "figures": figures,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
