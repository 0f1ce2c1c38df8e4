"""Tiny-shapes' plateau against runs that train by the exact backward first and by JAGG after (``jagg_from_step``).

    # the runs (one per seed; 2 side by side on 2 cores take about 25 min):
    jagg train configs/tiny-shapes-cpu.yaml strategy=jagg jagg_from_step=K steps=70 eval_every=5 sample_every=0 \\
      checkpoint_every=0 seed=S cv_frac=0 jagg_until_step=null output_dir=DIR name=from{K}-seed{S}
    # the table:
    python scripts/plateau_exact_first.py --runs DIR --out reports/plateau-exact-first

On mode-toy the exact backward for the first third of the run and JAGG after ends level with exact, where JAGG
first and exact after does not (docs/method.md, "The plateau reproduced"): the loss is made early. This script
puts each finished ``from{K}-seed{S}`` run of ``--runs`` beside the committed races' f-exact and f-jagg of the
same seed (reports/race/switch for seeds 0, 1, 11 and reports/race/control-variate for seed 2: the same config,
lr 5e-5, 70 steps, eval every 5; a run's first K steps reproduce f-exact's to the last digit, which the script
checks) and writes ``<out>/runs.json`` (every curve) and ``<out>/README.md``:

- the final eval reward and its gap to f-exact; the target is a gap ≥ −0.005 on every seed;
- the time to f-exact's final (per seed, the first eval at or above it, linearly interpolated), measured in
  the run's OWN step times over 70 steps at its own exact-phase step time (the median ``time/step`` of steps
  2..K): a same-run ratio, so the machine's load between sessions cancels; the target is ≤ 0.75×;
- the whole run's training time at that same unit (what the exact-first phase costs);
- the batch reward spread over the first and the last 10 steps (the plateau's signature).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jagg_engine.race.report import race_store  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402

REFERENCES = {  # seed → race folder holding its f-exact-seedS and f-jagg-seedS
    0: "reports/race/switch",
    1: "reports/race/switch",
    2: "reports/race/control-variate",
    11: "reports/race/switch",
}
NAME = re.compile(r"^from(\d+)-seed(\d+)$")
TARGET_GAP = -0.005
TARGET_TIME = 0.75


def eval_curve(frame: pd.DataFrame) -> dict[int, float]:
    rows = frame.dropna(subset=["eval/reward/mean"])
    return {int(s): float(v) for s, v in zip(rows["step"], rows["eval/reward/mean"])}


def spread(frame: pd.DataFrame, steps: int) -> tuple[float, float]:
    std = frame.dropna(subset=["reward/std"]).set_index("step")["reward/std"]
    first = std[(std.index >= 1) & (std.index <= 10)]
    last = std[(std.index > steps - 10) & (std.index <= steps)]
    return float(first.mean()), float(last.mean())


def crossing(curve: dict[int, float], level: float, elapsed: dict[int, float]) -> float | None:
    """Training seconds at which the eval curve first reaches ``level`` (linear between evals), or None."""
    steps = sorted(curve)
    for a, b in zip(steps, steps[1:]):
        if curve[b] >= level:
            if curve[a] >= level:
                return elapsed.get(a, 0.0)
            f = (level - curve[a]) / (curve[b] - curve[a])
            return elapsed.get(a, 0.0) + f * (elapsed[b] - elapsed.get(a, 0.0))
    return None


def reference(seed: int, variant: str) -> dict[str, Any]:
    with race_store(REPO / REFERENCES[seed]) as (store, _):
        run = next(r for r in store.list_runs() if r["name"] == f"{variant}-seed{seed}")
        frame = store.metrics_frame(run["id"])
    return {"frame": frame, "curve": eval_curve(frame), "source": REFERENCES[seed]}


def measure(runs: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with open_store(runs, read_only=True) as store:
        for run in store.list_runs():
            match = NAME.match(run["name"])
            if not match or run["status"] != "finished":
                continue
            k, seed = int(match.group(1)), int(match.group(2))
            if seed not in REFERENCES:
                continue
            frame = store.metrics_frame(run["id"])
            steps = int(run["config"]["steps"])
            exact, jagg = reference(seed, "f-exact"), reference(seed, "f-jagg")
            mine = frame.dropna(subset=["reward/mean"]).set_index("step")["reward/mean"]
            theirs = exact["frame"].dropna(subset=["reward/mean"]).set_index("step")["reward/mean"]
            same = all(mine[s] == theirs[s] for s in range(1, k + 1))  # the exact phase is f-exact's
            timed = frame.dropna(subset=["time/step"]).set_index("step")["time/step"]
            unit = statistics.median(
                timed[(timed.index >= 2) & (timed.index <= k)]
            )  # an exact step's seconds
            elapsed = {0: 0.0, **{int(s): float(v) for s, v in timed.cumsum().items()}}
            curve = eval_curve(frame)
            final_exact = exact["curve"][steps]
            reached = crossing(curve, final_exact, elapsed)
            out[run["name"]] = {
                "k": k,
                "seed": seed,
                "curve": curve,
                "f_exact": exact["curve"],
                "f_jagg": jagg["curve"],
                "references": exact["source"],
                "exact_phase_reproduces_f_exact": same,
                "exact_step_s": unit,
                "jagg_step_s": statistics.median(timed[timed.index > k]),
                "run_time_x": elapsed[steps] / (steps * unit),
                "time_to_f_exact_final_x": None if reached is None else reached / (steps * unit),
                "spread": spread(frame, steps),
                "spread_f_exact": spread(exact["frame"], steps),
                "spread_f_jagg": spread(jagg["frame"], steps),
            }
    return out


def write_readme(out: Path, runs: dict[str, Any]) -> None:
    ks = sorted({r["k"] for r in runs.values()})
    lines = [
        "# The exact backward first, JAGG after, on tiny-shapes (the plateau's early-loss reading at the shipped batch)",
        "",
        "Command: the module docstring of `scripts/plateau_exact_first.py` (the runs, then",
        "`python scripts/plateau_exact_first.py --runs DIR --out reports/plateau-exact-first`).",
        "The references are the committed races' f-exact and f-jagg of the same seed (lr 5e-5, 70 steps, the",
        "shipped batch): reports/race/switch (seeds 0, 1, 11) and reports/race/control-variate (seed 2).",
        "",
    ]
    for k in ks:
        mine = sorted((r for r in runs.values() if r["k"] == k), key=lambda r: r["seed"])
        steps = max(mine[0]["curve"])
        lines += [
            f"## Exact for steps 1–{k}, JAGG for {k + 1}–{steps} (`jagg_from_step={k}`)",
            "",
            "| seed | f-exact | f-jagg | exact first | gap to f-exact | f-exact's final at (× exact's time) | run time (× exact's) | spread first → last (f-exact; f-jagg) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        gaps, jgaps = [], []
        for r in mine:
            fe, fj, me = r["f_exact"][steps], r["f_jagg"][steps], r["curve"][steps]
            gaps.append(me - fe)
            jgaps.append(fj - fe)
            t = r["time_to_f_exact_final_x"]
            s, se, sj = r["spread"], r["spread_f_exact"], r["spread_f_jagg"]
            lines.append(
                f"| {r['seed']} | {fe:.3f} | {fj:.3f} ({fj - fe:+.3f}) | {me:.3f} | {me - fe:+.3f} | "
                f"{'not reached' if t is None else f'{t:.2f}×'} | {r['run_time_x']:.2f}× | "
                f"{s[0]:.3f} → {s[1]:.3f} ({se[0]:.3f} → {se[1]:.3f}; {sj[0]:.3f} → {sj[1]:.3f}) |"
            )
        n = len(gaps)
        se_gap = statistics.stdev(gaps) / n**0.5 if n > 1 else float("nan")
        times = [r["time_to_f_exact_final_x"] for r in mine]
        reached = sorted(t for t in times if t is not None)
        median = statistics.median([t if t is not None else float("inf") for t in times])
        lines += [
            "",
            f"- Mean gap {statistics.mean(gaps):+.3f} ± {se_gap:.3f} (f-jagg on the same seeds "
            f"{statistics.mean(jgaps):+.3f}); seeds below f-exact − 0.005: "
            f"{sum(g < TARGET_GAP for g in gaps)} of {n} (target: none).",
            f"- f-exact's final reached on {len(reached)} of {n} seeds; seed median "
            f"{'not reached' if median == float('inf') else f'{median:.2f}×'} of an exact run's time "
            f"(target ≤ {TARGET_TIME}×).",
            f"- A step's time, JAGG phase over exact phase (same run, medians): "
            f"{statistics.mean(r['jagg_step_s'] / r['exact_step_s'] for r in mine):.2f}.",
            "- The exact phase reproduces f-exact's per-step rewards to the last digit on "
            f"{sum(r['exact_phase_reproduces_f_exact'] for r in mine)} of {n} seeds (the same rollouts, so "
            "the comparison is paired).",
            "",
        ]
    lines += [
        "Times are each run's own: its training seconds over 70 × its own median exact-phase step (steps 2..K),",
        "so a run that ran beside other work is measured against itself. Finals are deterministic on this CPU.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=Path, required=True, help="the runs folder of the from{K}-seed{S} runs"
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "plateau-exact-first")
    args = parser.parse_args()
    runs = measure(args.runs)
    if not runs:
        raise SystemExit(
            f"error: --runs: no finished from<K>-seed<S> run of seeds {sorted(REFERENCES)} in {args.runs}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1, default=float) + "\n", encoding="utf-8")
    write_readme(args.out, runs)
    print((args.out / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
