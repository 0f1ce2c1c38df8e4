"""Tiny-shapes' plateau against JAGG with the cross-fitted far credit (``far_credit=cross``), at the shipped batch.

    # the runs (one per seed; two side by side on 2 cores, about 12 min each):
    jagg train configs/tiny-shapes-cpu.yaml strategy=jagg far_credit=cross steps=70 eval_every=5 sample_every=0 \\
      checkpoint_every=0 seed=S cv_frac=0 jagg_until_step=null jagg_from_step=null output_dir=DIR name=cross-seed{S}
    # the table (--runs: one or more runs folders; --report-only rebuilds README.md from the committed runs.json):
    python scripts/plateau_cross.py --runs DIR [DIR ...] --out reports/plateau-cross

Every finished ``cross-seedS`` run of ``--runs`` is put beside the references of the same seed: the committed
races' f-exact and f-jagg (reports/race/switch, reports/race/control-variate) and their reruns on another machine
(reports/plateau-exact-first/runs.json, seeds 1 and 11). A rerun of one seed is not bitwise the committed run
(the float kernels differ between machines), so the gap is taken to the mean of the seed's f-exact finals and
their spread is shown: what replication moves a final. Writes ``<out>/runs.json`` and ``<out>/README.md``:

- the final eval reward and its gap to f-exact; the target is a gap ≥ −0.005 on every seed;
- the step at which the run first reaches f-exact's final (linear between evals), and the time that takes in
  units of f-exact's 70 steps: steps × (JAGG step / exact step) / 70, the step-time ratio measured inside the
  exact-first runs of reports/plateau-exact-first (same run, same machine; the cross-fitted credit has JAGG's
  cost, a reshape of the upstream); the target is ≤ 0.75×;
- the batch reward spread over the first and the last 10 steps (the plateau's signature).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from plateau_exact_first import (  # noqa: E402
    NAME,
    REFERENCES,
    TARGET_GAP,
    TARGET_TIME,
    crossing,
    final,
    load,
    reference,
    summary,
    write_runs,
)

from jagg_engine.store import open_store  # noqa: E402

EXACT_FIRST = REPO / "reports" / "plateau-exact-first" / "runs.json"


def step_ratio() -> float:
    """The median JAGG step / exact step of the exact-first runs (each its own run's two phases)."""
    rows = [row for named in load(EXACT_FIRST).values() for row in named.values() if row.get("exact_step_s")]
    return statistics.median(row["jagg_step_s"] / row["exact_step_s"] for row in rows)


def measure(folders: list[Path], variant: str) -> dict[int, dict[str, Any]]:
    """The finished ``{variant}-seedS`` runs of ``folders`` by seed, with every reference of that seed."""
    seeds: dict[int, dict[str, Any]] = {}
    for runs in folders:
        with open_store(runs, read_only=True) as store:
            for run in store.list_runs():
                match = NAME.match(run["name"])
                if not match or match.group(1) != variant or run["status"] != "finished":
                    continue
                seed = int(match.group(2))
                if seed in REFERENCES:
                    steps = int(run["config"]["steps"])
                    seeds.setdefault(seed, {})[variant] = summary(store.metrics_frame(run["id"]), steps, None)
    reruns = load(EXACT_FIRST)
    ratio = step_ratio()
    for seed, named in seeds.items():
        for name in ("f-exact", "f-jagg"):
            ref = reference(seed, name)
            named[f"committed-{name}"] = {"source": ref["source"], **summary(ref["frame"], 70, None)}
            if name in reruns.get(seed, {}):
                named[f"rerun-{name}"] = {"source": str(EXACT_FIRST.relative_to(REPO)), **reruns[seed][name]}
        level = statistics.mean(final(named[n]) for n in ("committed-f-exact", "rerun-f-exact") if n in named)
        row = named[variant]
        steps = max(row["curve"])
        reached = crossing(row["curve"], level, {s: float(s) for s in row["curve"]})  # in steps
        row["f_exact_final"] = level
        row["step_ratio"] = ratio
        row["steps_to_f_exact_final"] = reached
        row["time_to_f_exact_final_x"] = None if reached is None else reached * ratio / steps
    return seeds


def write_readme(out: Path, seeds: dict[int, dict[str, Any]], variant: str) -> None:
    lines = [
        f"# JAGG with the cross-fitted far credit on tiny-shapes (`far_credit=cross`, runs `{variant}-seedS`)",
        "",
        "Command: the module docstring of `scripts/plateau_cross.py` (the runs, then",
        "`python scripts/plateau_cross.py --runs DIR --out reports/plateau-cross`; this README again from the",
        "committed runs.json: `python scripts/plateau_cross.py --report-only`).",
        "References of the same seed (lr 5e-5, 70 steps, the shipped batch): `committed` are the committed races'",
        "f-exact and f-jagg (reports/race/switch, seeds 0, 1, 11; reports/race/control-variate, seed 2); `rerun`",
        "the same configs trained again on another machine (reports/plateau-exact-first). The gap is to the mean of",
        "the seed's f-exact finals.",
        "",
        "Final eval reward (step 70), the gap to f-exact in brackets:",
        "",
        f"| seed | f-exact committed | f-exact rerun | f-jagg committed | f-jagg rerun | {variant} |",
        "|---|---|---|---|---|---|",
    ]
    gaps: dict[str, list[float]] = {}

    def cell(named: dict[str, Any], name: str, base: float, gap: bool = True) -> str:
        value = final(named.get(name))
        if value is None:
            return "—"
        if gap:  # committed and rerun finals of f-jagg pooled under one name
            gaps.setdefault(name if name == variant else name.split("-", 1)[-1], []).append(value - base)
        return f"{value:.3f}" + (f" ({value - base:+.3f})" if gap else "")

    for seed in sorted(seeds):
        named = seeds[seed]
        base = named[variant]["f_exact_final"]
        exact = [cell(named, n, base, False) for n in ("committed-f-exact", "rerun-f-exact")]
        jagg = [cell(named, n, base) for n in ("committed-f-jagg", "rerun-f-jagg")]
        lines.append(f"| {seed} | {' | '.join(exact)} | {' | '.join(jagg)} | {cell(named, variant, base)} |")
    lines += [
        "",
        "| run | finals | mean gap ± SE | below − 0.005 |",
        "|---|---|---|---|",
    ]
    for name, g in gaps.items():
        se = statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else float("nan")
        below = sum(x < TARGET_GAP for x in g)
        lines.append(f"| {name} | {len(g)} | {statistics.mean(g):+.3f} ± {se:.3f} | {below} of {len(g)} |")
    ratio = next(iter(seeds.values()))[variant]["step_ratio"]
    lines += [
        "",
        f"Time to f-exact's final (target ≤ {TARGET_TIME}×): the step at which the run's eval first reaches it,",
        f"times the JAGG / exact step-time ratio {ratio:.3f} (the median of the exact-first runs' two phases),",
        "over 70; and the batch reward spread (std of a step's rewards) over the first and the last 10 steps.",
        "",
        "| seed | f-exact's final | reached at step | × f-exact's time | spread first → last | f-exact's spread (committed) |",
        "|---|---|---|---|---|---|",
    ]
    for seed in sorted(seeds):
        row, exact = seeds[seed][variant], seeds[seed]["committed-f-exact"]
        at, x = row["steps_to_f_exact_final"], row["time_to_f_exact_final_x"]
        lines.append(
            f"| {seed} | {row['f_exact_final']:.3f} | {'not reached' if at is None else f'{at:.1f}'} | "
            f"{'—' if x is None else f'{x:.2f}×'} | {row['spread'][0]:.3f} → {row['spread'][1]:.3f} | "
            f"{exact['spread'][0]:.3f} → {exact['spread'][1]:.3f} |"
        )
    lines.append("")
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", help="runs folders of cross-seedS runs")
    parser.add_argument("--variant", default="cross", help="the runs' name before -seedS (default cross)")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "plateau-cross")
    parser.add_argument("--report-only", action="store_true", help="rebuild README.md from <out>/runs.json")
    args = parser.parse_args()
    if args.report_only:
        write_readme(args.out, load(args.out / "runs.json"), args.variant)
    else:
        if not args.runs:
            raise SystemExit(
                "error: --runs: give the runs folders (or --report-only to rebuild from runs.json)"
            )
        seeds = measure(args.runs, args.variant)
        if not seeds:
            raise SystemExit(
                f"error: --runs: no finished {args.variant}-seedS run of seeds {sorted(REFERENCES)} in {args.runs}"
            )
        write_runs(args.out, seeds)
        write_readme(args.out, seeds, args.variant)
    print((args.out / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
