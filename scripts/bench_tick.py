"""Cost of one tick of the app's timer on a long synthetic history (not a test: a benchmark to run by hand).

    python scripts/bench_tick.py                      # 100 runs × 400 steps × 40 keys = 1.6 M metric rows
    python scripts/bench_tick.py --runs 20 --steps 100 --repeats 5

Builds a runs folder with ``--runs`` runs (one of them running, in this process, so the queue pass finds a
live run), each with ``--steps`` steps of ``--keys`` metrics and ``--samples`` eval sample rows whose image
files are gone. The metrics are written in bulk (one transaction) and the ``latest`` summary is filled the
way a history from before it is migrated. Then, in interleaved rounds, it times with ``time.perf_counter``:

* ``tick``          one tab's timer call (``on_tick`` of the built app) when nothing is new: the queue pass,
                    the run list, the watched run's signature — the reads of a tick, done afresh;
* ``tick_4_tabs``   four tabs' timer calls in the same tick (they share one read);
* ``gallery``       the live view's gallery of a run whose image files are all gone;
* ``scan``          the run-list query the app ran before ``latest`` existed (final rewards by scanning the
                    metrics table), as the reference the figures are compared with.

Prints the medians (seconds) and the ratios scan / tick; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import data, ui  # noqa: E402
from jagg_engine.store import FINAL_REWARD_KEYS, open_store  # noqa: E402
from jagg_engine.train.config import TrainConfig  # noqa: E402

LEGACY_SCAN = (
    "SELECT m.run_id, m.key, m.value FROM metrics m JOIN (SELECT run_id, key, MAX(step) AS step"
    " FROM metrics WHERE key IN (?, ?) GROUP BY run_id, key) last"
    " ON m.run_id = last.run_id AND m.key = last.key AND m.step = last.step"
)


def build_history(root: Path, runs: int, steps: int, keys: int, samples: int) -> int:
    """Write the synthetic history; returns the id of the running run (the one the tab watches)."""
    names = list(FINAL_REWARD_KEYS) + ["reward/std", "loss/policy", "time/update", "time/step"]
    names += [f"extra/k{i}" for i in range(max(0, keys - len(names)))]
    names = names[:keys]
    config = TrainConfig(steps=steps).to_dict()
    with open_store(root) as store:
        ids = []
        for i in range(runs):
            run_dir = root / f"run-{i + 1:04d}"
            (run_dir / "samples").mkdir(parents=True)  # the eval images themselves are gone
            ids.append(store.create_run(f"run-{i}", config, run_dir))
        with store.db.conn:
            store.db.conn.executemany(
                "INSERT INTO metrics (run_id, step, key, value) VALUES (?, ?, ?, ?)",
                (
                    (run_id, step, key, ((run_id * 31 + step * 7 + k) % 100) / 100)
                    for run_id in ids
                    for step in range(steps)
                    for k, key in enumerate(names)
                ),
            )
            store.db.conn.executemany(
                "INSERT INTO samples (run_id, path, step, kind, prompt, seed, reward) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        run_id,
                        f"samples/eval/step{j // 90}-p{j % 90}.png",
                        j // 90,
                        "eval",
                        f"p{j % 90}",
                        0,
                        0.5,
                    )
                    for run_id in ids
                    for j in range(samples)
                ),
            )
            store.db.execute("UPDATE runs SET status = 'finished', last_step = ?", [steps - 1])
            store.db.execute(
                "UPDATE runs SET status = 'running', pid = ?, pid_at = ? WHERE id = ?",
                [os.getpid(), time.time(), ids[-1]],
            )
            store._refill_latest(None)  # as the migration of an older history does
        return ids[-1]


def median_rounds(fns: dict[str, callable], repeats: int) -> dict[str, float]:
    """Interleaved rounds: each round times every function once, in turn; medians per function."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--keys", type=int, default=40)
    p.add_argument("--samples", type=int, default=900, help="eval sample rows per run (files gone)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="jagg-bench-tick-") as tmp:
        root = Path(tmp) / "runs"
        t0 = time.perf_counter()
        watched = build_history(root, args.runs, args.steps, args.keys, args.samples)
        built_s = time.perf_counter() - t0
        demo = ui.build_app(
            root, background_ticks=False, command=lambda run_id, runs: [sys.executable, "-c", ""]
        )
        manager, shared = demo.jagg_manager, demo.jagg_shared
        on_tick = next(f.fn for f in demo.fns.values() if f.fn.__name__ == "on_tick")
        rows = manager.store.db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]

        clock = [0.0]
        shared.clock = lambda: clock[0]  # each timed call below starts a new tick
        first = on_tick(watched, 1.8, None, None)  # the tab draws once
        seen, list_seen = first[-3], first[-1]

        def one_tab() -> None:
            clock[0] += 10  # a new tick: nothing cached
            out = on_tick(watched, 1.8, seen, list_seen)
            assert out[-3] == seen, "the history changed during the benchmark"

        def four_tabs() -> None:
            clock[0] += 10
            for _ in range(4):
                on_tick(watched, 1.8, seen, list_seen)

        def gallery() -> None:
            assert data.gallery_items(manager.store, watched, root) == []

        def scan() -> None:
            manager.store.db.execute(LEGACY_SCAN, list(FINAL_REWARD_KEYS)).fetchall()

        medians = median_rounds(
            {"tick": one_tab, "tick_4_tabs": four_tabs, "gallery": gallery, "scan": scan}, args.repeats
        )
        manager.shutdown()

    result = {
        "runs": args.runs,
        "metric_rows": rows,
        "sample_rows_per_run": args.samples,
        "build_s": round(built_s, 1),
        **{f"{k}_s": round(v, 5) for k, v in medians.items()},
        "scan_over_tick": round(medians["scan"] / medians["tick"], 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"history: {args.runs} runs, {rows:,} metric rows, {args.samples} sample rows a run (files gone)"
        )
        print(f"one tick, nothing new, one tab:  {medians['tick'] * 1000:8.2f} ms (median of {args.repeats})")
        print(f"one tick, nothing new, 4 tabs:   {medians['tick_4_tabs'] * 1000:8.2f} ms")
        print(f"gallery of a run, images gone:   {medians['gallery'] * 1000:8.2f} ms")
        print(
            f"old run-list scan of metrics:    {medians['scan'] * 1000:8.2f} ms ({result['scan_over_tick']}× a tick)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
