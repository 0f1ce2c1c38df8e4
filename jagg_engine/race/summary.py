"""Time to quality from eval curves: the first crossing of a level, seed means, the spread over seeds,
and the Markdown table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .plan import RaceError

# ------------------------------------------------------------------------------------------------ curves


METHOD = (
    "first crossing of the piecewise-linear curve through the eval points (training time, eval reward): "
    "linear interpolation between the last eval below the level and the first at or above it"
)


@dataclass(frozen=True)
class Curve:
    """Eval points of one run (or a seed mean): eval step, training seconds at it, eval reward; by step."""

    steps: tuple[int, ...]
    times: tuple[float, ...]
    values: tuple[float, ...]

    def to_dict(self) -> dict[str, list]:
        return {"step": list(self.steps), "time_s": list(self.times), "eval": list(self.values)}


def time_to_reach(times: Sequence[float], values: Sequence[float], level: float) -> float | None:
    """The first time the piecewise-linear curve through (times[i], values[i]) reaches ``level``: with i the
    first point at or above it, t_{i−1} + (level − y_{i−1}) / (y_i − y_{i−1}) · (t_i − t_{i−1}) (linear
    interpolation; y_{i−1} < level ≤ y_i, so the division is safe); times[0] when the first point is at or
    above it; None when no point is. Later dips below the level do not matter (first crossing)."""
    for i, (t, y) in enumerate(zip(times, values)):
        if y >= level:
            if i == 0:
                return float(t)
            t0, y0 = times[i - 1], values[i - 1]
            return float(t0 + (level - y0) / (y - y0) * (t - t0))
    return None


def eval_curve(frame: Any) -> Curve:
    """A run's eval points from its metrics frame: steps with ``eval/reward/mean``, at ``time/train_elapsed``
    (0 at step 0, before any training). An eval step without its training time raises RaceError."""
    if frame.empty or "eval/reward/mean" not in frame:
        return Curve((), (), ())
    rows = frame[frame["eval/reward/mean"].notna()]
    elapsed = rows["time/train_elapsed"] if "time/train_elapsed" in rows else [math.nan] * len(rows)
    times = []
    for step, value in zip(rows["step"], elapsed):
        if step == 0:
            times.append(0.0)
        elif math.isnan(value):
            raise RaceError(
                f"step {int(step)}: an eval without time/train_elapsed (a history older than jagg race)"
            )
        else:
            times.append(float(value))
    return Curve(
        tuple(int(s) for s in rows["step"]), tuple(times), tuple(float(v) for v in rows["eval/reward/mean"])
    )


def mean_curve(curves: Sequence[Curve]) -> Curve:
    """The seed mean: at each eval step every curve has, the mean training time and the mean eval reward."""
    common = sorted(set.intersection(*(set(c.steps) for c in curves))) if curves else []
    at = [dict(zip(c.steps, zip(c.times, c.values))) for c in curves]
    return Curve(
        tuple(common),
        tuple(statistics.fmean(a[s][0] for a in at) for s in common),
        tuple(statistics.fmean(a[s][1] for a in at) for s in common),
    )


def _spread(values: Mapping[int, float | None]) -> dict[str, Any]:
    got = [v for v in values.values() if v is not None]
    return {
        "per_seed": {str(k): v for k, v in values.items()},
        "mean": statistics.fmean(got) if got else None,
        "min": min(got) if got else None,
        "max": max(got) if got else None,
        "std": statistics.pstdev(got) if len(got) > 1 else (0.0 if got else None),
        "reached": len(got),
        "seeds": len(values),
    }


SPREAD_STEPS = 10  # the training steps at each end of a run over which its batch reward spread is averaged


def batch_spread(frame: Any) -> tuple[float, float] | None:
    """A run's batch reward spread (``reward/std``: the standard deviation of the rewards of one step's
    samples) averaged over its first and last :data:`SPREAD_STEPS` training steps; None without it."""
    if frame.empty or "reward/std" not in frame:
        return None
    values = [float(v) for v in frame["reward/std"].dropna()]
    if len(values) < 2:
        return None
    n = min(SPREAD_STEPS, len(values) // 2)
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def best_eval(curve: Curve) -> tuple[float, int]:
    """A run's best eval and the first eval step that has it: the checkpoint a user who keeps the best one
    ends with. A run that gains and then declines has its best before its final."""
    value, step = max(zip(curve.values, (-s for s in curve.steps)))
    return value, -step


def _gaps(
    values: Mapping[int, float], base: Mapping[int, float]
) -> tuple[dict[int, float], float | None, float | None]:
    """Per-seed differences against the baseline, their mean and its standard error over seeds."""
    common = sorted(set(values) & set(base))
    gaps = {seed: values[seed] - base[seed] for seed in common}
    got = list(gaps.values())
    se = statistics.stdev(got) / math.sqrt(len(got)) if len(got) > 1 else None
    return gaps, (statistics.fmean(got) if got else None), se


def paired(
    finals: Mapping[int, float],
    base_finals: Mapping[int, float],
    spreads: Mapping[int, tuple[float, float]],
    bests: Mapping[int, tuple[float, int]] | None = None,
    base_bests: Mapping[int, tuple[float, int]] | None = None,
) -> dict[str, Any]:
    """A variant against the baseline seed by seed: the final eval's difference (mean, its standard error
    over seeds, the seeds below the baseline's final), and the batch reward spread at the start and the end
    (seed means): the signature of a run that stops learning while its samples grow apart. With ``bests``
    (seed → :func:`best_eval`), the same for the best eval and the median step of it: a variant that ends
    below the baseline only because it peaked earlier and declined, as every variant may, has its best level."""
    gaps, mean, se = _gaps(finals, base_finals)
    got = [spreads[s] for s in sorted(spreads)]
    out = {
        "final_gap_per_seed": {str(k): v for k, v in gaps.items()},
        "final_gap_mean": mean,
        "final_gap_se": se,
        "seeds_below": sum(v < 0 for v in gaps.values()),
        "seeds_paired": len(gaps),
        "spread_first": statistics.fmean(a for a, _ in got) if got else None,
        "spread_last": statistics.fmean(b for _, b in got) if got else None,
        "spread_per_seed": {str(k): list(v) for k, v in spreads.items()},
    }
    if bests is not None and base_bests is not None:
        gaps, mean, se = _gaps(
            {k: v for k, (v, _) in bests.items()}, {k: v for k, (v, _) in base_bests.items()}
        )
        out.update(
            best_gap_per_seed={str(k): v for k, v in gaps.items()},
            best_gap_mean=mean,
            best_gap_se=se,
            best_seeds_below=sum(v < 0 for v in gaps.values()),
            best_step_per_seed={str(k): step for k, (_, step) in bests.items()},
            best_step_median=statistics.median(step for _, step in bests.values()) if bests else None,
        )
    return out


def summarise(
    curves: Mapping[str, Mapping[int, Curve]],
    baseline: str,
    spreads: Mapping[str, Mapping[int, tuple[float, float]]] | None = None,
) -> dict[str, Any]:
    """Time to quality of every variant from its per-seed curves (variant → seed → curve, baseline among
    them): the level, the baseline's training time, and per variant the seed-mean crossing, the per-seed
    crossings, the ratio, the final eval and the training time; with ``spreads`` (variant → seed → the
    batch reward spread at the start and the end, :func:`batch_spread`), the variant against the baseline
    seed by seed (:func:`paired`). Variants keep their order."""
    if not curves.get(baseline) or not any(c.steps for c in curves[baseline].values()):
        raise RaceError(
            f"variant {baseline!r}: the baseline has no finished run with an eval to race against"
        )
    base_mean = mean_curve(list(curves[baseline].values()))
    if not base_mean.steps:
        raise RaceError(f"variant {baseline!r}: its seeds share no eval step")
    level, base_time = base_mean.values[-1], base_mean.times[-1]
    base_final_time = {seed: c.times[-1] for seed, c in curves[baseline].items() if c.steps}
    base_finals = {seed: c.values[-1] for seed, c in curves[baseline].items() if c.steps}
    base_bests = {seed: best_eval(c) for seed, c in curves[baseline].items() if c.steps}
    results = []
    for name, per_seed in curves.items():
        per_seed = {seed: c for seed, c in per_seed.items() if c.steps}
        mean = mean_curve(list(per_seed.values()))
        reach = time_to_reach(mean.times, mean.values, level) if mean.steps else None
        seed_reach = {seed: time_to_reach(c.times, c.values, level) for seed, c in per_seed.items()}
        same_seed = {
            str(seed): (t / base_final_time[seed] if t is not None and base_final_time.get(seed) else None)
            for seed, t in seed_reach.items()
        }
        results.append(
            {
                "variant": name,
                "baseline": name == baseline,
                "seeds": sorted(per_seed),
                "final_step": mean.steps[-1] if mean.steps else None,
                "final_eval": _spread({seed: c.values[-1] for seed, c in per_seed.items()}),
                "final_eval_seed_mean": mean.values[-1] if mean.steps else None,
                "training_time_s": _spread({seed: c.times[-1] for seed, c in per_seed.items()}),
                "time_to_level_s": reach,
                "time_to_level_per_seed_s": _spread(seed_reach),
                "ratio_to_baseline_time": reach / base_time if reach is not None and base_time > 0 else None,
                "ratio_to_same_seed_baseline": same_seed,
                "curve": mean.to_dict(),
                "curves_per_seed": {str(seed): c.to_dict() for seed, c in per_seed.items()},
            }
        )
        if spreads is not None:
            finals = {seed: c.values[-1] for seed, c in per_seed.items()}
            kept = {seed: v for seed, v in spreads.get(name, {}).items() if seed in per_seed}
            bests = {seed: best_eval(c) for seed, c in per_seed.items()}
            results[-1]["paired"] = paired(finals, base_finals, kept, bests, base_bests)
    start = base_mean.values[0] if base_mean.steps[0] == 0 else None
    return {
        "baseline": baseline,
        "level": level,
        "level_step": base_mean.steps[-1],
        "baseline_start": start,  # the step-0 eval: at or above it, the level was reached before any training
        "baseline_improved": start is None or level > start,
        "baseline_time_s": base_time,
        "method": METHOD,
        "variants": results,
    }


# ------------------------------------------------------------------------------------------------ output


def _secs(t: float | None) -> str:
    if t is None:
        return "—"
    return f"{t:.{2 if t < 10 else 1 if t < 100 else 0}f} s"


def markdown_table(summary: Mapping[str, Any]) -> str:
    """The race as a Markdown table (README-ready), headed by one line saying what the columns mean."""
    base, level = summary["baseline"], summary["level"]
    lines = [
        f"Time to {base}'s final seed-mean eval reward, {level:.4f} (step {summary['level_step']}), in training"
        f" wall time (evals left out): first crossing of the seed-mean curve, linearly interpolated between"
        f" evals; × = that time over {base}'s training time to its final eval ({_secs(summary['baseline_time_s'])});"
        " per seed: each seed's own curve, min–max (seeds that reached it / seeds).",
        "",
        f"| variant | time to {level:.4f} | × {base}'s time | per seed: min–max (reached) | final eval: mean"
        " [min–max] | training time: mean |",
        "|---|---|---|---|---|---|",
    ]
    if not summary.get("baseline_improved", True):
        lines[1:1] = [
            "",
            f"Note: {base}'s final eval is not above its step-0 eval ({summary['baseline_start']:.4f}): the"
            " baseline did not improve, so the curves start at or above the level and the times say nothing.",
        ]
    if summary.get("partial"):
        lines[0:0] = [f"**Partial:** {summary['partial']}.", ""]
    for r in summary["variants"]:
        per = r["time_to_level_per_seed_s"]
        span = "—" if per["min"] is None else f"{_secs(per['min'])} – {_secs(per['max'])}"
        ratio = (
            "not reached" if r["ratio_to_baseline_time"] is None else f"{r['ratio_to_baseline_time']:.2f}×"
        )
        fe = r["final_eval"]
        final = "—" if fe["mean"] is None else f"{fe['mean']:.4f} [{fe['min']:.4f} – {fe['max']:.4f}]"
        name = f"{r['variant']} (baseline)" if r["baseline"] else r["variant"]
        reach = "not reached" if r["time_to_level_s"] is None else _secs(r["time_to_level_s"])
        lines.append(
            f"| {name} | {reach} | {ratio} | {span} ({per['reached']}/{per['seeds']}) | {final} |"
            f" {_secs(r['training_time_s']['mean'])} |"
        )
    rows = [r for r in summary["variants"] if r.get("paired")]
    if rows:
        lines += [
            "",
            f"Seed by seed against {base}: the final eval's difference (mean ± its standard error over seeds; the"
            f" seeds that end below {base}), and the batch reward spread (the std of one step's rewards) over the"
            f" first and the last {SPREAD_STEPS} training steps, seed means.",
            "",
            f"| variant | final − {base}'s | seeds below | reward spread: first → last |",
            "|---|---|---|---|",
        ]
        best_rows = []
        for r in rows:
            pr = r["paired"]
            gap = "—" if pr["final_gap_mean"] is None else f"{pr['final_gap_mean']:+.4f}"
            if pr["final_gap_se"] is not None and not r["baseline"]:
                gap += f" ± {pr['final_gap_se']:.4f}"
            spread = (
                "—" if pr["spread_first"] is None else f"{pr['spread_first']:.3f} → {pr['spread_last']:.3f}"
            )
            below = "—" if r["baseline"] else f"{pr['seeds_below']}/{pr['seeds_paired']}"
            lines.append(f"| {r['variant']} | {gap} | {below} | {spread} |")
            if pr.get("best_gap_mean") is not None:
                best = f"{pr['best_gap_mean']:+.4f}"
                if pr["best_gap_se"] is not None and not r["baseline"]:
                    best += f" ± {pr['best_gap_se']:.4f}"
                below = "—" if r["baseline"] else f"{pr['best_seeds_below']}/{pr['seeds_paired']}"
                best_rows.append(f"| {r['variant']} | {best} | {below} | {pr['best_step_median']:g} |")
        if best_rows:
            lines += [
                "",
                f"The best eval of each run (the checkpoint kept by one who keeps the best), against {base}'s seed by"
                f" seed: a variant that ends below {base} only because it peaked sooner and then declined has its"
                " best level with it.",
                "",
                f"| variant | best − {base}'s best | seeds below | step of the best: median |",
                "|---|---|---|---|",
                *best_rows,
            ]
    return "\n".join(lines) + "\n"
