"""Tiny-shapes' plateau against runs that train by the exact backward first and by JAGG after (``jagg_from_step``).

    # the runs (one per seed; two side by side on 2 cores, about 11 min each):
    jagg train configs/tiny-shapes-cpu.yaml strategy=jagg jagg_from_step=K steps=70 eval_every=5 sample_every=0 \\
      checkpoint_every=0 seed=S cv_frac=0 jagg_until_step=null output_dir=DIR name=from{K}-seed{S}
    # optional, the same seeds' baselines rerun beside them (name=f-exact-seed{S} strategy=exact, f-jagg-seed{S})
    # the table (--runs: one or more runs folders; --report-only rebuilds README.md from the committed runs.json):
    python scripts/plateau_exact_first.py --runs DIR [DIR ...] --out reports/plateau-exact-first

On mode-toy the exact backward for the first third of the run and JAGG after ends level with exact, where JAGG
first and exact after does not (docs/method.md, "The plateau reproduced"): the loss is made early. This script
puts every finished ``NAME-seedS`` run of ``--runs`` (``from{K}``, and ``f-exact`` / ``f-jagg`` reruns) beside
the committed races' f-exact and f-jagg of the same seed (reports/race/switch for seeds 0, 1, 11 and
reports/race/control-variate for seed 2: the same config, lr 5e-5, 70 steps, eval every 5). A rerun of the same
seed on another machine is not bitwise the committed run (its float kernels differ), so the gaps are measured
against this session's f-exact where there is one, and the rerun's difference to the committed run is shown:
what replication moves a final. Writes ``<out>/runs.json`` (every curve) and ``<out>/README.md``:

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
NAME = re.compile(r"^(.+)-seed(\d+)$")
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


def summary(frame: pd.DataFrame, steps: int, exact_steps: int | None) -> dict[str, Any]:
    """A run's eval curve, spread, and times in units of its own exact step (``exact_steps``: the steps 1..K
    it trained by the exact backward, whose median step time is the unit; None: a run without that phase)."""
    timed = frame.dropna(subset=["time/step"]).set_index("step")["time/step"]
    row: dict[str, Any] = {"curve": eval_curve(frame), "spread": spread(frame, steps)}
    row["elapsed"] = {0: 0.0, **{int(s): float(v) for s, v in timed.cumsum().items()}}
    if exact_steps:
        row["exact_step_s"] = statistics.median(timed[(timed.index >= 2) & (timed.index <= exact_steps)])
        row["jagg_step_s"] = statistics.median(timed[timed.index > exact_steps])
    return row


def measure(folders: list[Path]) -> dict[str, Any]:
    """Every finished ``NAME-seedS`` run of the runs ``folders`` (S a seed of REFERENCES), by seed then name, with the
    committed races' f-exact and f-jagg of that seed as ``committed-f-exact`` / ``committed-f-jagg``."""
    seeds: dict[int, dict[str, Any]] = {}
    for runs in folders:
        with open_store(runs, read_only=True) as store:
            for run in store.list_runs():
                match = NAME.match(run["name"])
                if not match or run["status"] != "finished" or int(match.group(2)) not in REFERENCES:
                    continue
                name, seed = match.group(1), int(match.group(2))
                steps, k = int(run["config"]["steps"]), run["config"].get("jagg_from_step")
                frame = store.metrics_frame(run["id"])
                seeds.setdefault(seed, {})[name] = {"k": k, **summary(frame, steps, k)}
    for seed, named in seeds.items():
        for variant in ("f-exact", "f-jagg"):
            ref = reference(seed, variant)
            named[f"committed-{variant}"] = {"source": ref["source"], **summary(ref["frame"], 70, None)}
    for named in seeds.values():  # times to f-exact's final, in each exact-first run's own exact steps
        exact = named.get("f-exact", named["committed-f-exact"])
        level = exact["curve"][max(exact["curve"])]
        for row in named.values():
            if row.get("exact_step_s"):
                steps = max(row["curve"])
                reached = crossing(row["curve"], level, row["elapsed"])
                row["run_time_x"] = row["elapsed"][steps] / (steps * row["exact_step_s"])
                row["time_to_f_exact_final_x"] = (
                    None if reached is None else reached / (steps * row["exact_step_s"])
                )
    return seeds


def final(row: dict[str, Any] | None) -> float | None:
    return None if row is None else row["curve"][max(row["curve"])]


def cell(value: float | None, base: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if base is None else f"{value:.3f} ({value - base:+.3f})"


def write_readme(out: Path, seeds: dict[int, dict[str, Any]]) -> None:
    tried = sorted(
        {n for named in seeds.values() for n in named if n.startswith("from")}, key=lambda n: int(n[4:])
    )
    lines = [
        "# The exact backward first, JAGG after, on tiny-shapes (the plateau's early-loss reading at the shipped batch)",
        "",
        "Command: the module docstring of `scripts/plateau_exact_first.py` (the runs, then",
        "`python scripts/plateau_exact_first.py --runs DIR --out reports/plateau-exact-first`; this README again",
        "from the committed runs.json: `python scripts/plateau_exact_first.py --report-only`).",
        "`committed` are the committed races' f-exact and f-jagg of the same seed (lr 5e-5, 70 steps, the shipped",
        "batch): reports/race/switch (seeds 0, 1, 11) and reports/race/control-variate (seed 2). `this session`",
        "are the same configs rerun here beside the new runs, where there was time: the difference between the two",
        "is what a rerun of the same seed moves a final (the float kernels differ between machines, so runs of one",
        "seed agree to ~1e-6 at step 0 and drift apart from there).",
        "",
        "Final eval reward (step 70); the gap in brackets is to f-exact of this session where there is one, else",
        "to the committed f-exact.",
        "",
        "| seed | f-exact committed | f-exact this session | f-jagg committed | f-jagg this session | "
        + " | ".join(f"{n} (`jagg_from_step={n[4:]}`)" for n in tried)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(tried),
    ]
    gaps: dict[str, list[float]] = {}
    for seed in sorted(seeds):
        named = seeds[seed]
        base = final(named.get("f-exact")) or final(named["committed-f-exact"])
        row = [
            str(seed),
            cell(final(named["committed-f-exact"])),
            cell(final(named.get("f-exact"))),
            cell(final(named["committed-f-jagg"]), base),
            cell(final(named.get("f-jagg")), base),
        ]
        for n in tried:
            row.append(cell(final(named.get(n)), base))
        for n in ("f-jagg", "committed-f-jagg", *tried):
            if final(named.get(n)) is not None:
                gaps.setdefault(n, []).append(final(named[n]) - base)
        jagg = named.get("f-jagg", named["committed-f-jagg"])  # this session's where rerun
        gaps.setdefault("f-jagg (this session's where rerun, else committed)", []).append(final(jagg) - base)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| run | seeds | mean gap ± SE | seeds below − 0.005 |", "|---|---|---|---|"]
    for n, g in gaps.items():
        se = statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else float("nan")
        lines.append(
            f"| {n} | {len(g)} | {statistics.mean(g):+.3f} ± {se:.3f} | {sum(x < TARGET_GAP for x in g)} |"
        )
    lines += [
        "",
        "Time and spread of the exact-first runs: the time to f-exact's final (per seed, the first eval at or above",
        "it, linearly interpolated) and the whole run, in units of 70 of the run's OWN exact steps (the median",
        "`time/step` of steps 2..K), so a run beside other work is measured against itself; the batch reward",
        "spread (std of a step's rewards) over the first and the last 10 steps.",
        "",
        "| run | seed | f-exact's final at | run time | JAGG step / exact step | spread first → last | f-exact's spread |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in sorted(seeds):
        named = seeds[seed]
        exact = named.get("f-exact", named["committed-f-exact"])
        for n in tried:
            r = named.get(n)
            if r is None:
                continue
            t = r["time_to_f_exact_final_x"]
            lines.append(
                f"| {n} | {seed} | {'not reached' if t is None else f'{t:.2f}×'} | {r['run_time_x']:.2f}× | "
                f"{r['jagg_step_s'] / r['exact_step_s']:.2f} | {r['spread'][0]:.3f} → {r['spread'][1]:.3f} | "
                f"{exact['spread'][0]:.3f} → {exact['spread'][1]:.3f} |"
            )
    lines.append("")
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def load(path: Path) -> dict[int, dict[str, Any]]:
    """``runs.json`` back into :func:`measure`'s shape (JSON keys are text; seeds and steps are numbers)."""
    seeds = json.loads(path.read_text(encoding="utf-8"))
    return {
        int(seed): {
            n: {**row, "curve": {int(k): v for k, v in row["curve"].items()}} for n, row in named.items()
        }
        for seed, named in seeds.items()
    }


def write_runs(out: Path, seeds: dict[int, dict[str, Any]]) -> None:
    """``<out>/runs.json``: every run's row by seed (its cumulative times left out), read back by :func:`load`."""
    out.mkdir(parents=True, exist_ok=True)
    kept = {
        str(seed): {name: {k: v for k, v in row.items() if k != "elapsed"} for name, row in named.items()}
        for seed, named in sorted(seeds.items())
    }
    (out / "runs.json").write_text(json.dumps(kept, indent=1, default=float) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", help="runs folders of NAME-seedS runs")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "plateau-exact-first")
    parser.add_argument("--report-only", action="store_true", help="rebuild README.md from <out>/runs.json")
    args = parser.parse_args()
    if args.report_only:
        write_readme(args.out, load(args.out / "runs.json"))
    else:
        if not args.runs:
            raise SystemExit(
                "error: --runs: give the runs folders (or --report-only to rebuild from runs.json)"
            )
        seeds = measure(args.runs)
        if not seeds:
            raise SystemExit(
                f"error: --runs: no finished NAME-seedS run of seeds {sorted(REFERENCES)} in {args.runs}"
            )
        write_runs(args.out, seeds)
        write_readme(args.out, seeds)
    print((args.out / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
