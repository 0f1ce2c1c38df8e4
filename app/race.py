"""`jagg race`: time to quality. Variants of one config trained side by side; eval reward against training time.

    jagg race CONFIG --variant NAME:key=value,... [--variant ...] --seeds 0,1,2 --out DIR [key=value ...]
    jagg race --report-only --out DIR [--baseline NAME]

Each variant is the config with its own ``key=value`` overrides on top of the trailing ones (which apply to
every variant, as ``jagg train`` takes them; a variant's own value wins); the FIRST variant is the baseline.
Every (variant, seed) config is validated before anything starts: a bad spec or field is one line naming the
variant, and nothing is written. Variants must measure the eval alike (every field of :data:`EVAL_FIELDS`:
eval prompts, seeds, rewards, sampling steps, shift, schedule, cfg_scale, backbone and its options, model_path,
precision) and evaluate at the same steps (the same ``eval_every`` >= 1: a variant with cheaper steps and
its own eval_every would get denser eval points in time, which favours it at a first crossing).

Schedule: one heat per seed, heats one after the other. In a heat the variants start together, each with an
equal share of the CPU cores as torch threads (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``), the rule the app uses
for a compare pair (:func:`app.runs.plan_pair` with one run per variant); on a GPU machine, or with fewer
cores than training processes, they run one after the other (``--threads N`` forces side by side at N
threads each). Every run is a ``jagg train --run-id`` process in its own process group, in the store
``DIR/runs/jagg.db``; Ctrl-C (or SIGTERM) stops them all cooperatively (each finishes its step, saves and
reads ``cancelled``), a second Ctrl-C kills them.

Faults: no trainer outlives the race's process (the driver), even one killed with SIGKILL: a watchdog
process stops every trainer's process group once the driver is gone (SIGTERM, SIGKILL ``ORPHAN_GRACE_S``
later), and each trainer has SIGTERM as its parent-death signal. The driver holds an exclusive
``fcntl.flock`` on ``DIR/.race.lock`` for its life, so one race runs per folder (:func:`claim_out`) and a
race.json that reads ``running`` while nobody holds the lock belongs to a driver that is gone: the next
``--report-only`` or ``jagg runs`` marks it ``interrupted`` (:func:`driver_gone`), and a report of a race
that did not finish every planned run says it is partial (:func:`race_state`).

Time axis: the trainer's ``time/train_elapsed`` (wall seconds of training from step 1 to the end of a step's
update, evals left out; :class:`jagg_engine.train.trainer.TrainingClock`), logged every step in the store, so
:func:`report` rebuilds every figure from ``DIR/runs/jagg.db`` and the run ids in ``DIR/race.json``.

Time to quality: the level is the baseline's final seed-mean eval reward. A variant's seed-mean curve is the
mean over its seeds of (training time, eval reward) at each eval step they share; its time to the level is
the FIRST CROSSING of the piecewise-linear curve through those points (:func:`time_to_reach`: linear
interpolation between the last eval below the level and the first at or above it; a curve that starts at or
above it reaches it at its first point; one that never does has no time). The spread over seeds is each
seed's own curve against the same level: per-seed times, their mean and min–max, and how many seeds reached
it. The ratio is that time over the baseline's seed-mean training time at its final eval.

Outputs in DIR: ``race.json`` (plan, runs, curves, figures), ``race.svg`` (the curves, a self-contained file
a README shows), ``race.md`` (the Markdown table, also printed). ``--report-only --baseline NAME`` measures
against another variant (race-vs-NAME.*). No torch here; the trainers are processes.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import html
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.runs import (
    SIDE_BY_SIDE,
    THREAD_VARS,
    PairPlan,
    gpu_present,
    kill_group,
    plan_pair,
    train_command,
    usable_cores,
)
from jagg_engine.errors import UsageError
from jagg_engine.store import DB_NAME, RunStore, StoreError, open_store, pid_alive

RACE_JSON, RACE_SVG, RACE_MD = "race.json", "race.svg", "race.md"
LOCK_NAME = ".race.lock"  # held (fcntl.flock) by the race's driver for its whole life: one race per folder
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
RACE_SET = ("seed", "name")  # fields the race sets itself (from --seeds and the variant's name)
# Fields the eval depends on: variants that differ in one would not be scored on the same measure.
EVAL_FIELDS = (
    "eval_prompts_file",
    "eval_num_prompts",
    "eval_seeds",
    "rewards",
    "reward_options",
    "sampling_steps",
    "shift",
    "schedule",
    "cfg_scale",
    "backbone",
    "backbone_options",
    "model_path",
    "precision",
    "eval_every",
)
POLL_S = 1.0


def _eval_value(cfg: Any, key: str) -> Any:
    """What field ``key`` of ``cfg`` means for the eval: ``schedule`` as resolved (null = the backbone's
    default), every other field as set."""
    return cfg.resolved_schedule() if key == "schedule" else getattr(cfg, key)


STOP_GRACE_S = 300.0  # how long a cooperative stop may take (one training step) before the runs are killed
ORPHAN_GRACE_S = (
    5.0  # a driver gone: its runs get SIGTERM, then SIGKILL this long after (no trainer outlives it)
)
METHOD = (
    "first crossing of the piecewise-linear curve through the eval points (training time, eval reward): "
    "linear interpolation between the last eval below the level and the first at or above it"
)
_THREADS_LOG = re.compile(r"torch CPU threads: (\d+)")


class RaceError(RuntimeError):
    """A race that could not finish (a run failed, the store holds no such race); one line."""


# ------------------------------------------------------------------------------------------------ specs


@dataclass(frozen=True)
class Variant:
    """One contestant: a name and its ``key=value`` overrides of the config."""

    name: str
    overrides: tuple[str, ...]


def split_overrides(text: str) -> list[str]:
    """``key=value,key=value`` → items, split at commas outside YAML flow brackets: ``eval_seeds=[0,1]`` and
    ``rewards={a: 1, b: 2}`` stay whole. ``\\,`` is a literal comma in a plain value. ValueError (one line)
    on unbalanced brackets."""
    items, buf, depth, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] == ",":
            buf.append(",")
            i += 2
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {c!r} in {text!r}")
        if c == "," and depth == 0:
            items.append("".join(buf))
            buf = []
        else:
            buf.append(c)
        i += 1
    if depth:
        raise ValueError(f"unclosed bracket in {text!r}")
    items.append("".join(buf))
    return [item.strip() for item in items if item.strip()]


def parse_variant(text: str) -> Variant:
    """``NAME:key=value,...`` → :class:`Variant`; UsageError (one line naming the spec) otherwise."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep:
        raise UsageError(f"--variant {text!r}: must look like NAME:key=value,... (e.g. exact:strategy=exact)")
    if not NAME_RE.match(name):
        raise UsageError(
            f"--variant {text!r}: the name must be 1-64 letters, digits or _ . + - (starting with a letter or"
            f" digit), got {name!r}"
        )
    try:
        overrides = split_overrides(rest)
    except ValueError as exc:
        raise UsageError(f"variant {name!r}: {exc}") from None
    for item in overrides:
        key, eq, _ = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"variant {name!r}: {item!r} must look like key=value")
    return Variant(name, tuple(overrides))


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` → [0, 1, 2]: distinct integers; UsageError otherwise."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise UsageError(f"seeds: a comma-separated list of integers, e.g. 0,1,2; got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds: must not repeat a seed, got {text!r}")
    return seeds


def _keys(overrides: Sequence[str]) -> set[str]:
    return {item.partition("=")[0].strip() for item in overrides}


def check_variants(
    config: str | None, common: Sequence[str], variants: Sequence[Variant], seeds: Sequence[int]
) -> dict[tuple[str, int], Any]:
    """The validated TrainConfig of every (variant, seed): config ← trailing overrides ← the variant's, with
    ``seed`` and ``name`` set by the race. Every variant is checked before this returns; the first problem is
    a UsageError naming the variant and the field."""
    from jagg_engine.train.config import ConfigError, load_config

    if len(variants) < 2:
        raise UsageError(
            "variant: a race needs at least two --variant NAME:key=value,... (the first is the baseline)"
        )
    names = [v.name for v in variants]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"variant {name!r}: given twice; each variant needs its own name")
    hint = {"seed": "--seeds", "name": "the variant name"}
    if fixed := sorted(_keys(common) & set(RACE_SET)):
        raise UsageError(f"{fixed[0]}: set by the race ({hint[fixed[0]]}); drop it")
    configs: dict[tuple[str, int], Any] = {}
    for v in variants:
        if fixed := sorted(_keys(v.overrides) & set(RACE_SET)):
            raise UsageError(f"variant {v.name!r}: {fixed[0]}: set by the race ({hint[fixed[0]]}); drop it")
        for seed in seeds:
            try:
                cfg = load_config(
                    config, [*common, *v.overrides, f"seed={seed}", f"name={v.name}-seed{seed}"]
                )
            except ConfigError as exc:
                raise UsageError(f"variant {v.name!r}: {exc}") from None
            if not cfg.eval_every:
                raise UsageError(
                    f"variant {v.name!r}: eval_every: the race reads the eval reward; must be >= 1, got 0"
                )
            configs[(v.name, seed)] = cfg
    base = configs[(variants[0].name, seeds[0])]
    for v in variants[1:]:
        cfg = configs[(v.name, seeds[0])]
        for key in EVAL_FIELDS:
            if _eval_value(cfg, key) != _eval_value(base, key):
                raise UsageError(
                    f"variant {v.name!r}: {key}: {_eval_value(cfg, key)!r} differs from the baseline's"
                    f" {_eval_value(base, key)!r}; the eval reward must be measured alike in every variant"
                )
        source = (cfg.eval_prompts_file or cfg.prompts_file, base.eval_prompts_file or base.prompts_file)
        if source[0] != source[1]:
            raise UsageError(
                f"variant {v.name!r}: prompts_file: the eval reads it (eval_prompts_file is null) and it differs"
                f" from the baseline's ({source[0]!r} vs {source[1]!r})"
            )
    return configs


def schedule(configs: Mapping[tuple[str, int], Any], variants: int, threads: int | None) -> PairPlan:
    """How a heat runs: :func:`app.runs.plan_pair`'s rule for ``variants`` runs at once on this machine, or side
    by side at ``threads`` torch threads each when given."""
    processes = max(int(cfg.processes) for cfg in configs.values())
    if threads is not None:
        return PairPlan(SIDE_BY_SIDE, threads, f"{threads} CPU thread(s) each, as --threads asked")
    return plan_pair(processes, usable_cores(), gpu_present(), runs=variants)


# ------------------------------------------------------------------------------------------------ curves


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


def summarise(curves: Mapping[str, Mapping[int, Curve]], baseline: str) -> dict[str, Any]:
    """Time to quality of every variant from its per-seed curves (variant → seed → curve, baseline among
    them): the level, the baseline's training time, and per variant the seed-mean crossing, the per-seed
    crossings, the ratio, the final eval and the training time. Variants keep their order."""
    if not curves.get(baseline) or not any(c.steps for c in curves[baseline].values()):
        raise RaceError(
            f"variant {baseline!r}: the baseline has no finished run with an eval to race against"
        )
    base_mean = mean_curve(list(curves[baseline].values()))
    if not base_mean.steps:
        raise RaceError(f"variant {baseline!r}: its seeds share no eval step")
    level, base_time = base_mean.values[-1], base_mean.times[-1]
    base_final_time = {seed: c.times[-1] for seed, c in curves[baseline].items() if c.steps}
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
    return "\n".join(lines) + "\n"


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _ticks(lo: float, hi: float, n: int = 5) -> list[tuple[float, str]]:
    """About ``n`` round ticks in [lo, hi] (1, 2 or 5 × a power of ten apart), each with its label, written
    with as many decimals as the spacing needs."""
    raw = ((hi - lo) or abs(hi) or 1.0) / n
    power = math.floor(math.log10(raw))
    step = next(m * 10.0**power for m in (1, 2, 5, 10) if m * 10.0**power >= raw)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    count = int((hi - first) / step + 1e-9) + 1
    return [(first + i * step, f"{first + i * step:.{decimals}f}") for i in range(count)]


def race_svg(summary: Mapping[str, Any], width: int = 900, height: int = 460) -> str:
    """The race as one static SVG: each variant's per-seed eval curves (thin) and seed mean (thick, dots)
    against training time, the level (dashed) and where each seed-mean curve first reaches it (a diamond and a
    dotted drop to the time axis). Self-contained: no script, no external font or file."""
    variants = summary["variants"]
    pts = [
        (t, y)
        for r in variants
        for c in [r["curve"], *r["curves_per_seed"].values()]
        for t, y in zip(c["time_s"], c["eval"])
    ]
    level = summary["level"]
    x1 = max([t for t, _ in pts] + [1e-9])
    ys = [y for _, y in pts] + [level]
    pad = max(0.06 * (max(ys) - min(ys)), 1e-3)
    y0, y1 = min(ys) - pad, max(ys) + pad
    left, right, top, bottom = 64, 24, 40, 64 + 18 * len(variants)

    def px(x: float) -> float:
        return left + x / x1 * (width - left - right)

    def py(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * (height - top - bottom)

    base = summary["baseline"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' role="img" aria-label="eval reward against training time" style="font: 12px sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{left}" y="22" font-size="14">Eval reward against training wall time (evals left out); '
        f"seed mean thick, seeds thin{' (partial: the race did not finish)' if summary.get('partial') else ''}"
        "</text>",
    ]
    for t, label in _ticks(0.0, x1):
        out.append(
            f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{height - bottom}" stroke="#eee"/>'
            f'<text x="{px(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">{label}</text>'
        )
    for y, label in _ticks(y0, y1, 6):
        out.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{width - right}" y2="{py(y):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{label}</text>'
        )
    out += [
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
        f'<text x="{(left + width - right) / 2}" y="{height - bottom + 34}" text-anchor="middle">'
        "training wall time (s)</text>",
        f'<text transform="translate(16 {(top + height - bottom) / 2}) rotate(-90)" text-anchor="middle">'
        "eval reward</text>",
        f'<line class="level" x1="{left}" y1="{py(level):.1f}" x2="{width - right}" y2="{py(level):.1f}"'
        f' stroke="#555" stroke-dasharray="6 4"/>',
        f'<text x="{width - right - 4}" y="{py(level) - 6:.1f}" text-anchor="end" fill="#555">'
        f"{html.escape(base)}'s final eval {level:.4f}</text>",
    ]
    for i, r in enumerate(variants):
        color = _COLORS[i % len(_COLORS)]
        name = html.escape(r["variant"])
        for seed, c in r["curves_per_seed"].items():
            points = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in zip(c["time_s"], c["eval"]))
            out.append(
                f'<polyline class="seed" data-variant="{name}" data-seed="{seed}" fill="none" stroke="{color}"'
                f' stroke-opacity="0.35" stroke-width="1.2" points="{points}"><title>{name} seed {seed}</title>'
                "</polyline>"
            )
        c = r["curve"]
        points = " ".join(f"{px(t):.1f},{py(y):.1f}" for t, y in zip(c["time_s"], c["eval"]))
        out.append(
            f'<polyline class="mean" data-variant="{name}" fill="none" stroke="{color}" stroke-width="2.5"'
            f' points="{points}"><title>{name}, seed mean</title></polyline>'
        )
        out += [
            f'<circle cx="{px(t):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>'
            for t, y in zip(c["time_s"], c["eval"])
        ]
        reach = r["time_to_level_s"]
        if reach is not None:
            x, y = px(reach), py(level)
            out.append(
                f'<g class="reach" data-variant="{name}" data-time="{reach:.6g}">'
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{height - bottom}" stroke="{color}"'
                ' stroke-dasharray="2 3"/>'
                f'<path d="M{x:.1f} {y - 6:.1f} L{x + 6:.1f} {y:.1f} L{x:.1f} {y + 6:.1f} L{x - 6:.1f} {y:.1f} Z"'
                f' fill="{color}"/></g>'
            )
        ly = height - bottom + 52 + 18 * i
        ratio = r["ratio_to_baseline_time"]
        when = (
            "does not reach it"
            if reach is None
            else f"reaches it at {_secs(reach)} ({ratio:.2f}× {base}'s time)"
        )
        fe = r["final_eval_seed_mean"]
        final = "" if fe is None else f"; final eval {fe:.4f}"
        label = html.escape(f"{r['variant']}{' (baseline)' if r['baseline'] else ''}: {when}{final}")
        out.append(
            f'<line x1="{left}" y1="{ly - 4}" x2="{left + 28}" y2="{ly - 4}" stroke="{color}" stroke-width="2.5"/>'
            f'<text x="{left + 36}" y="{ly}">{label}</text>'
        )
    return "".join(out) + "</svg>\n"


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file of this writer beside ``path`` and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def report(
    out: Path, plan: dict[str, Any] | None = None, baseline: str | None = None
) -> tuple[dict[str, Any], list[Path]]:
    """Rebuild the race's figures from its store (``out/runs/jagg.db``) and plan (``out/race.json``): write
    race.json (the plan with the results), race.svg and race.md; return the summary and the files written.
    Only finished runs count. ``baseline``: another variant as the baseline, written to race-vs-NAME.json
    (the summary), .svg and .md beside the race's own files, which stay as they are.

    A race that has not finished every planned run (interrupted, failed, still running) is reported as far
    as it got: the summary's ``partial`` says so in one line (also atop the table and the figure); a race
    still running (its driver holds the folder) is reported but nothing is written, so its driver's
    race.json stays the only writer's."""
    plan = plan if plan is not None else _read_plan(out)
    names = [v["name"] for v in plan["variants"]]
    if baseline is not None and baseline not in names:
        raise UsageError(f"--baseline: {baseline!r} is not a variant of this race; one of {', '.join(names)}")
    store = open_store(out / "runs")
    try:
        curves: dict[str, dict[int, Curve]] = {name: {} for name in names}
        for entry in plan["runs"]:
            run = store.get_run(entry["run_id"])
            if run is None:
                raise RaceError(f"run {entry['run_id']}: not in {store.path}")
            entry["status"] = run["status"]
            entry["threads_logged"] = _threads_logged(run)
            frame = store.metrics_frame(run["id"])
            entry["trained_from_unix"], entry["trained_to_unix"] = _trained_span(frame)
            if run["status"] == "finished":
                try:
                    curves[entry["variant"]][entry["seed"]] = eval_curve(frame)
                except RaceError as exc:
                    raise RaceError(
                        f"run {run['id']} ({entry['variant']}, seed {entry['seed']}): {exc}"
                    ) from None
    finally:
        store.close()
    status, unfinished = race_state(plan)
    against = baseline if baseline is not None else names[0]
    try:
        summary = summarise(curves, against)
    except RaceError as exc:
        raise RaceError(f"{unfinished}; {exc}" if unfinished else str(exc)) from None
    summary["partial"] = f"{unfinished}; this report covers only them (partial)" if unfinished else None
    if status == "running":  # its driver is alive and writes race.json: report, write nothing
        return summary, []
    if against != names[0]:
        stem = f"race-vs-{baseline}"
        files = [out / f"{stem}.json", out / f"{stem}.svg", out / f"{stem}.md"]
        _write_atomic(files[0], json.dumps({"command": plan["command"], "summary": summary}, indent=1))
    else:
        plan["heats"] = _heats(plan)
        plan["summary"] = summary
        files = [out / RACE_JSON, out / RACE_SVG, out / RACE_MD]
        _write_atomic(files[0], json.dumps(plan, indent=1))
    _write_atomic(files[1], race_svg(summary))
    _write_atomic(files[2], f"```bash\n{plan['command']}\n```\n\n{markdown_table(summary)}")
    return summary, files


def _threads_logged(run: Mapping[str, Any]) -> int | None:
    """The torch CPU threads the trainer reported in its train.log (the last start, after a resume)."""
    try:
        found = _THREADS_LOG.findall((Path(run["run_dir"]) / "train.log").read_text(errors="replace"))
    except (OSError, TypeError):
        return None
    return int(found[-1]) if found else None


def _trained_span(frame: Any) -> tuple[float | None, float | None]:
    """Unix times at which a run's training started (its first step's end less its training time) and ended."""
    if frame.empty or "time/unix" not in frame:
        return None, None
    rows = frame[frame["time/unix"].notna() & frame["time/train_elapsed"].notna()]
    if rows.empty:
        return None, None
    first = rows.iloc[0]
    return float(first["time/unix"] - first["time/train_elapsed"]), float(rows["time/unix"].iloc[-1])


def _heats(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per seed, how long its runs trained together (side by side: all of them at once)."""
    heats = []
    for seed in plan["seeds"]:
        spans = [(e["trained_from_unix"], e["trained_to_unix"]) for e in plan["runs"] if e["seed"] == seed]
        if not spans or any(a is None or b is None for a, b in spans):
            continue
        heats.append(
            {
                "seed": seed,
                "all_training_together_s": max(0.0, min(b for _, b in spans) - max(a for a, _ in spans)),
                "first_start_to_last_end_s": max(b for _, b in spans) - min(a for a, _ in spans),
            }
        )
    return heats


# ------------------------------------------------------------------------------------------------ the folder


def _read_plan(out: Path) -> dict[str, Any]:
    return json.loads((out / RACE_JSON).read_text(encoding="utf-8"))


def _lock_holder(fd: int) -> str:
    """The pid a driver wrote into the lock file it holds, once written (it takes the lock first, then
    writes: up to a second); "?" when it has not."""
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError, IndexError):
            return str(int(os.pread(fd, 32, 0).split()[0]))
        time.sleep(0.05)
    return "?"


def claim_out(out: Path, plan: Mapping[str, Any]) -> int:
    """Claim ``out`` for one race, atomically: take an exclusive ``fcntl.flock`` on ``out/.race.lock`` (never
    waiting), refuse a folder that holds a race already, and write ``plan`` as its ``race.json``, all while
    holding the lock. Returns the lock's file descriptor: the race holds it (and so the folder) until its
    process ends, whatever ends it; the kernel releases it then. A second race on the folder, started at the
    same instant or later, is one UsageError line."""
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UsageError(f"--out: {out}: cannot create {LOCK_NAME}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UsageError(
                    f"--out: {out}: cannot lock {LOCK_NAME} ({exc.strerror or exc}); a race needs a folder"
                    " that supports file locks, so that one race runs in it at a time"
                ) from None
            raise UsageError(
                f"--out: {out}: another jagg race runs in it (pid {_lock_holder(fd)}); not started"
            ) from None
        if (out / RACE_JSON).exists():
            raise UsageError(
                f"--out: {out} holds a race already ({RACE_JSON}); give a new folder, or --report-only"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
    except BaseException:
        os.close(fd)
        raise
    return fd


def driver_gone(out: Path) -> str | None:
    """A race that reads ``running`` but whose driver is gone (killed, its machine rebooted): mark its
    race.json ``interrupted`` and return the one line that says so; None for a race that is running (its
    driver holds the folder's lock), ended, or not there. The driver's lock is the test (a pid can be
    reused; a lock dies with its process); a race.json without a lock file (written before the lock
    existed) falls back to the driver's pid. A folder that cannot be written is told, not changed."""
    try:
        if _read_plan(out).get("status") != "running":
            return None
    except (OSError, ValueError, AttributeError):
        return None
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(out / LOCK_NAME, flags | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            break
        except OSError:
            continue
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None  # held: the driver is alive
        plan = _read_plan(out)  # again, under the lock
        driver = plan.get("driver") or {}
        if plan.get("status") != "running" or (fd is None and _pid_alive(driver)):
            return None
        plan["status"] = "interrupted"
        plan["interrupted"] = {
            "at_unix": time.time(),
            "why": f"its driver (pid {driver.get('pid', '?')}) is gone",
        }
        line = f"race {out}: interrupted: its driver (pid {driver.get('pid', '?')}) is gone"
        try:
            _write_atomic(out / RACE_JSON, json.dumps(plan, indent=1))
        except OSError as exc:
            return f"{line} ({RACE_JSON} not updated: {exc.strerror or exc})"
        return line
    except (OSError, ValueError, AttributeError):
        return None
    finally:
        if fd is not None:
            os.close(fd)


def _pid_alive(driver: Mapping[str, Any]) -> bool:
    try:
        return pid_alive(int(driver["pid"]), driver.get("started_at"))
    except (KeyError, TypeError, ValueError):
        return False


def check_runs_folder(runs_dir: str | os.PathLike[str]) -> str | None:
    """For ``jagg runs``: when ``runs_dir`` is a race's ``DIR/runs`` and the race's driver is gone, mark the
    race interrupted (:func:`driver_gone`) and return its line."""
    folder = Path(runs_dir)
    if folder.name != "runs":  # `--runs-dir .` from inside it
        folder = folder.resolve()
    if folder.name != "runs" or not (folder.parent / RACE_JSON).is_file():
        return None
    return driver_gone(folder.parent)


def race_state(plan: Mapping[str, Any]) -> tuple[str, str | None]:
    """How far the race got (its runs' statuses read from the store): its status, and for a race that has
    not finished every planned run, the words that say so (``the race is interrupted (…): 1 of 4 planned
    runs finished``)."""
    planned = len(plan["variants"]) * len(plan["seeds"])
    finished = sum(1 for e in plan["runs"] if e.get("status") == "finished")
    status = plan.get("status", "running")
    if status == "finished" and finished == planned:
        return status, None
    why = {
        "running": "still running",
        "interrupted": "interrupted",
        "failed": "failed",
    }.get(status, status)
    if status == "interrupted" and plan.get("interrupted"):
        why += f" ({plan['interrupted']['why']})"
    return status, f"the race is {why}: {finished} of {planned} planned runs finished"


# ------------------------------------------------------------------------------------------------ running


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


# ------------------------------------------------------------------------------------------------ CLI


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:key=value,...",
        help="a contestant: a name and its overrides (commas inside [...] or {...} do not split; \\, is a"
        " literal comma). Give two or more; the first is the baseline.",
    )
    p.add_argument(
        "--seeds", default="0,1,2", help="comma-separated seeds; one heat per seed (default 0,1,2)"
    )
    p.add_argument(
        "--out", required=False, default=None, help="folder of the race: runs/, race.json, .svg, .md"
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=None,
        help="torch CPU threads of each run, side by side whatever the machine (default: the app's rule for"
        " a compare pair: the cores split evenly between the variants, or one after the other on a GPU or"
        " with too few cores)",
    )
    p.add_argument(
        "--report-only", action="store_true", help="rebuild race.json/.svg/.md of --out DIR from its store"
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="NAME",
        help="with --report-only: measure against this variant instead of the first (race-vs-NAME.json/.svg/.md)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (see configs/); omitted = the tiny-shapes defaults")
    p.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="key=value overrides of every variant, as `jagg train` takes them (before or after the options)",
    )
    _add_options(p)


class _OptionsParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def _parse_rest(args: argparse.Namespace) -> None:
    """Options given after the first positional land in ``overrides`` (argparse.REMAINDER): parse them out,
    keeping the ones given before, so options and key=value items may come in any order."""
    p = _OptionsParser(prog="jagg race", add_help=False)
    _add_options(p)
    _, rest = p.parse_known_args(args.overrides, namespace=args)
    if args.config and "=" in args.config and not Path(args.config).is_file():  # `jagg race steps=3 ...`
        rest, args.config = [args.config, *rest], None
    for item in rest:
        if item.startswith("-"):
            raise UsageError(f"unrecognized option {item!r}")
    args.overrides = rest


def run(args: argparse.Namespace) -> int:
    _parse_rest(args)
    if not args.out:
        raise UsageError("--out: required (the race's folder)")
    out = Path(args.out)
    try:
        if args.report_only:
            if not (out / RACE_JSON).is_file() or not (out / "runs" / DB_NAME).is_file():
                raise UsageError(f"--out: {out} holds no race ({RACE_JSON} and runs/{DB_NAME})")
            gone = driver_gone(out)  # a race whose driver is gone reads interrupted from now on
            plan = _read_plan(out)
            if gone and plan.get("status") == "running":  # race.json could not be updated (read-only)
                print(f"jagg race: {gone}", file=sys.stderr)
                plan["status"] = "interrupted"
            summary, files = report(out, plan, baseline=args.baseline)
            if summary.get("partial"):
                print(f"jagg race: {summary['partial']}", file=sys.stderr)
        else:
            if args.baseline is not None:
                raise UsageError(
                    "--baseline: only with --report-only; a race's baseline is its first --variant"
                )
            variants = [parse_variant(text) for text in args.variant or []]
            seeds = parse_seeds(args.seeds)
            command = shlex.join(["jagg", "race", *sys.argv[2:]]) if sys.argv[1:2] == ["race"] else ""
            summary = race(args.config, args.overrides, variants, seeds, out, args.threads, command)
            files = [out / RACE_JSON, out / RACE_SVG, out / RACE_MD]
    except RaceError as exc:
        print(f"jagg race: error: {exc}", file=sys.stderr)
        return 1
    print(markdown_table(summary))
    written = (
        ", ".join(map(str, files)) or "nothing written while the race runs (its driver writes the files)"
    )
    print(f"jagg race: {written}", file=sys.stderr)
    return 0
