"""Pure read-side functions of the app: run store → DataFrame, plotly figure, gallery items, text.

Nothing here launches, cancels or writes anything; every function takes a :class:`RunStore` (or rows and
frames read from one) and returns a value the UI shows. ``app/ui.py`` wires them to gr.Blocks; tests call
them directly on a temporary store filled with synthetic rows.

Metric keys are the store's (``reward/mean``, ``time/update`` …, see :mod:`jagg_engine.store`).
"""

from __future__ import annotations

import html
import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app.metrics import empty_figure
from app.text import md_code_block, md_text
from jagg_engine.cost import predicted_speedup
from jagg_engine.sde_kinds import SDE_KINDS
from jagg_engine.store import RunStore, file_tail

# Step-time phases, in the order they are stacked (bottom → top), with their labels.
TIME_PHASES = (
    ("time/sampling", "sampling"),
    ("time/reward", "reward"),
    ("time/probe", "probe"),  # the gradient-fidelity probe and auto_route's probe, not reward time
    ("time/update_forward", "update forward"),
    ("time/update_backward", "update backward"),
)
R_CPU = 1.8  # forward+backward / forward cost measured on the 2-core CPU (PAPER.md, cost model)
R_GPU = 3.0  # the theoretical ratio on GPUs
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


# ---------------------------------------------------------------------------------------------- cost model
# predicted_speedup is jagg_engine.cost's (torch-free): the app and `jagg bench` print the same number.


def trained_steps(config: Mapping[str, Any]) -> int:
    """Sampling steps a training step of this stored config trains: its fixed SDE window, or W under sliding
    and random (the schedules whose window of W steps moves)."""
    start = config.get("sde_window_start") or 0
    end = config.get("sde_window_end")
    if end is None:
        last_stochastic = SDE_KINDS[config.get("algorithm", "flow-grpo")].last_step_stochastic
        end = config["sampling_steps"] - (0 if last_stochastic else 1)
    if config.get("sde_window_schedule") in ("sliding", "random"):
        return min(int(config["window"]), end - start)
    return end - start


def config_speedup(
    config: Mapping[str, Any], r: float, exact_config: Mapping[str, Any] | None = None
) -> float | None:
    """The prediction for a stored run config (its W, jagg_frac, strategy, trained-step count, velocity reuse
    and mini-batches per rollout; a config from before those fields ran without reuse, one update a rollout).
    A sliding SDE window trains W steps a step, one group, wherever it stands.

    Against ``exact_config`` (the exact run it is measured against) that trains another number of steps a
    step (e.g. Flow-GRPO's whole range against a sliding window), the prediction is scaled by that ratio: the
    exact run's update costs its own trained steps × r."""
    try:
        steps = trained_steps(config)
        speedup = predicted_speedup(
            int(config["window"]),
            r,
            float(config["jagg_frac"]),
            config.get("strategy", "jagg"),
            steps,
            reuse=config.get("reuse_rollout_velocity") == "auto",
            updates_per_rollout=int(config.get("updates_per_rollout", 1)),
        )
        return speedup if exact_config is None else speedup * trained_steps(exact_config) / steps
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def default_r(has_gpu: bool) -> float:
    return R_GPU if has_gpu else R_CPU


# ---------------------------------------------------------------------------------------------- run tables


def run_label(run: Mapping[str, Any]) -> str:
    """``#12 tiny-shapes (jagg, running)`` — the name a dropdown shows for a run."""
    strategy = run.get("config", {}).get("strategy", "?")
    return f"#{run['id']} {run['name']} ({strategy}, {run['status']})"


def run_duration(run: Mapping[str, Any], now: float | None = None) -> float | None:
    """Wall seconds from start to finish (to now for a live run); None if it never started. A resumed run's
    span includes the time it sat idle between its attempts: :func:`training_duration` leaves that out."""
    start = run.get("started_at")
    if start is None:
        return None
    end = run.get("finished_at") or (now if now is not None else time.time())
    return max(0.0, float(end) - float(start))


TRAINING_CLOCK_KEYS = ("time/train_elapsed", "time/unix", "time/step")


def training_duration(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None
) -> float | None:
    """The run's training seconds: the trainer's clock at its last logged step (``time/train_elapsed``, from
    step 1 to the end of that step's update, evals and the idle time of a resumed run left out), read from
    ``last`` (:meth:`RunStore.last_values` of :data:`TRAINING_CLOCK_KEYS`). A history logged before that clock
    falls back to the wall span (:func:`run_duration`); None when the run never started."""
    value = (last or {}).get("time/train_elapsed", (None, None))[1]
    if value is not None and math.isfinite(float(value)):
        return max(0.0, float(value))
    return run_duration(run)


def seconds_per_step(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None
) -> float | None:
    """Training seconds per step so far: the trainer's clock at the last step over the steps done (the
    steps of a resumed run's earlier attempts included, its idle time not); None before a step is logged."""
    step, elapsed = (last or {}).get("time/train_elapsed", (None, None))
    if step and elapsed is not None and math.isfinite(float(elapsed)) and step > 0:
        return float(elapsed) / int(step)
    return None


def human_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 04 min``; "" for None."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


HISTORY_COLUMNS = (
    "id", "name", "status", "backbone", "W", "jagg_frac", "strategy", "step",
    "final reward", "started", "duration", "paired", "note", "error",
)  # fmt: skip


def started_text(run: Mapping[str, Any]) -> str:
    """When the run first started, ``2026-12-03 07:32`` (UTC); "" if it never did."""
    start = run.get("started_at")
    return "" if start is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(start)))


def history_frame(store: RunStore, notes: Mapping[int, str] | None = None) -> pd.DataFrame:
    """Every run, newest first: id, name, status, backbone, W, jagg_frac, strategy, step (a running run's
    with its s/step and ETA, :func:`progress_line`), final reward, started (UTC), duration (its training
    time, :func:`training_duration`, as ``3 min 05 s``), paired run (an integer id), its note (``notes``: run
    id → text) and error."""
    rows = []
    for run in store.list_runs():
        cfg = run["config"]
        final = run.get("final_reward")
        last = store.last_values(run["id"], TRAINING_CLOCK_KEYS)
        step = f"{run.get('last_step') if run.get('last_step') is not None else '-'}/{cfg.get('steps')}"
        rows.append(
            {
                "id": run["id"],
                "name": run["name"],
                "status": run["status"],
                "backbone": cfg.get("backbone"),
                "W": cfg.get("window"),
                "jagg_frac": cfg.get("jagg_frac"),
                "strategy": cfg.get("strategy"),
                "step": progress_line(run, last).removeprefix("step ")
                if run["status"] == "running"
                else step,
                "final reward": None if final is None else round(float(final), 4),
                "started": started_text(run),
                "duration": human_duration(training_duration(run, last)),
                "paired": run.get("paired_run_id"),
                "note": (notes or {}).get(run["id"], ""),
                "error": (run.get("error") or "").splitlines()[0] if run.get("error") else "",
            }
        )
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    frame["paired"] = frame["paired"].astype("Int64")  # run #10, never "10.0" next to an empty cell
    return frame


HISTORY_FILTERS = ("status", "backbone", "strategy")
ALL = "all"


def filter_history(frame: pd.DataFrame, search: str = "", **equal: str | None) -> pd.DataFrame:
    """The rows whose id, name or note holds every word of ``search`` (case-insensitive; ``12`` or ``#12``
    is run #12 itself, never #112) and whose status, backbone and strategy equal the ones given (None, "" or
    "all": any)."""
    keep = pd.Series(True, index=frame.index)
    text = (frame["name"].astype(str) + " " + frame["note"].astype(str)).str.lower()
    ids = frame["id"].astype(str)
    for word in (search or "").lower().split():
        number = word.removeprefix("#")
        by_id = ids == number if number.isdigit() else pd.Series(False, index=frame.index)
        keep &= text.str.contains(word, regex=False) | by_id
    for column, value in equal.items():
        if column not in HISTORY_FILTERS:
            raise ValueError(f"filter: must be one of {', '.join(HISTORY_FILTERS)}, got {column!r}")
        if value and value != ALL:
            keep &= frame[column].astype(str) == str(value)
    return frame[keep].reset_index(drop=True)


def progress(run: Mapping[str, Any]) -> tuple[int, int]:
    """(steps done, steps planned). Training steps are numbered from 1 (step 0 is the eval before
    training), so last_step is the number of steps done."""
    steps = int(run.get("config", {}).get("steps") or 0)
    last = run.get("last_step")
    done = 0 if last is None else min(steps, int(last))
    if run.get("status") == "finished":
        done = steps
    return done, steps


def progress_line(run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None) -> str:
    """``step 9/14``, and for a running run with its training clock logged (``last``: :meth:`RunStore.last_values`
    of :data:`TRAINING_CLOCK_KEYS`) ``step 9/14 · 5.8 s/step · ETA 29 s`` (the steps left at the run's
    training seconds per step so far, :func:`seconds_per_step`)."""
    done, steps = progress(run)
    text = f"step {done}/{steps}"
    per_step = seconds_per_step(run, last) if run.get("status") == "running" else None
    if per_step is not None:
        text += f" · {per_step:.1f} s/step · ETA {human_duration(per_step * max(0, steps - done))}"
    return text


def progress_markdown(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None
) -> str:
    """A text progress bar: ``step 3/10 · 5.8 s/step · ETA 41 s ███░░░░░░░ 30 % · running``
    (:func:`progress_line`)."""
    done, steps = progress(run)
    frac = done / steps if steps else 0.0
    bar = "█" * round(20 * frac) + "░" * (20 - round(20 * frac))
    name = md_text(run["name"])  # a visitor's text: shown as typed, never as Markdown or HTML
    text = (
        f"**Run #{run['id']} {name}** — {progress_line(run, last)} `{bar}` {100 * frac:.0f} % · "
        f"**{run['status']}**"
    )
    if run.get("error"):
        text += "\n\n" + md_code_block(str(run["error"]))
    return text


# ---------------------------------------------------------------------------------------------- figures


def reward_names(frame: pd.DataFrame) -> list[str]:
    """Reward series in a metrics frame: "total" (reward/mean) then each component reward/<name>/mean."""
    names = ["total"] if "reward/mean" in frame.columns else []
    for col in frame.columns:
        parts = col.split("/")
        if len(parts) == 3 and parts[0] == "reward" and parts[2] == "mean":
            names.append(parts[1])
    return names


TREND_STEPS = 10  # trailing window of the reward trend line
TREND_MIN_STEPS = 5  # the line starts once this many steps are averaged (a single step is a prompt lottery)


def reward_figure(
    frames: Mapping[str, pd.DataFrame],
    title: str = "Reward",
    x: str = "step",
    runs: Mapping[str, Mapping[str, Any]] | None = None,
) -> go.Figure:
    """Training reward per step, a mean line (its ± std in the hover) for each run (label → metrics frame) and each reward
    it logged; a bold trailing mean of the total over TREND_STEPS steps, from TREND_MIN_STEPS on (a single
    step's mean moves with its prompt mix); the deterministic eval reward (eval/reward/mean) as a dashed line of diamonds.

    The hover of a point gives reward/std (total) or reward/<name>/std (component) when logged: the spread
    of one step's samples is about as wide as the whole curve, so drawn as a band it would hide the means.
    With a single reward its own series (equal to the total up to its weight) is left out. Trace names are
    ``<label> · <reward>``, ``<label> · total, mean of last N steps`` and ``<label> · eval``.

    ``x``: the x axis, one of :data:`app.metrics.X_AXES` (step, wall time, relative time; ``runs``: label →
    run row, whose ``started_at`` the time axes need).
    """
    from app.metrics import axis_title, integer_step_ticks, x_values

    fig = go.Figure()
    for i, (label, frame) in enumerate(frames.items()):
        color = _COLORS[i % len(_COLORS)]
        xs = x_values(frame, (runs or {}).get(label), x)
        names = reward_names(frame)
        if len(names) == 2:  # one reward: its own series is the total again
            names = names[:1]
        for j, name in enumerate(names):
            mean_key = "reward/mean" if name == "total" else f"reward/{name}/mean"
            std_key = "reward/std" if name == "total" else f"reward/{name}/std"
            rows = frame[["step", mean_key] + ([std_key] if std_key in frame.columns else [])].dropna(
                subset=[mean_key]
            )
            if rows.empty:
                continue
            dash = "solid" if j == 0 else ("dot", "dash", "dashdot")[(j - 1) % 3]
            prefix = f"{label} · " if label else ""
            # The spread of a step's samples (±std) is as wide as the whole learning curve on real runs: a
            # band of it hides the means, so it is in the hover of each point instead.
            std = rows[std_key] if std_key in rows.columns else None
            fig.add_trace(
                go.Scatter(
                    x=xs[rows.index], y=rows[mean_key], mode="lines+markers", name=f"{prefix}{name}",
                    line={"color": color, "dash": dash, "width": 1}, marker={"size": 4}, opacity=0.6,
                    customdata=None if std is None else std.to_numpy(),
                    hovertemplate=None if std is None else "%{x}: %{y:.4g} ± %{customdata:.3g} (std)",
                )
            )  # fmt: skip
            if name == "total" and len(rows) >= TREND_MIN_STEPS:  # the trend through single steps' noise
                trend = rows[mean_key].rolling(TREND_STEPS, min_periods=TREND_MIN_STEPS).mean()
                fig.add_trace(
                    go.Scatter(
                        x=xs[rows.index], y=trend, mode="lines", line={"color": color, "width": 3},
                        name=f"{prefix}total, mean of last {TREND_STEPS} steps",
                    )
                )  # fmt: skip
        if "eval/reward/mean" in frame.columns:
            rows = frame[["step", "eval/reward/mean"]].dropna()
            if not rows.empty:
                fig.add_trace(
                    go.Scatter(
                        x=xs[rows.index], y=rows["eval/reward/mean"], mode="lines+markers",
                        marker={"symbol": "diamond", "size": 9, "color": color},
                        line={"color": color, "dash": "dash", "width": 2},
                        name=f"{label + ' · ' if label else ''}eval",
                    )
                )  # fmt: skip
    if not fig.data:
        return empty_figure(title)
    lines = [v for t in fig.data for v in t.y if v is not None and v == v]
    if lines:  # the y axis fitted to the means, with a margin
        lo, hi = min(lines), max(lines)
        pad = max(0.15 * (hi - lo), 0.02 * max(abs(lo), abs(hi)), 1e-3)
        fig.update_yaxes(range=[lo - pad, hi + pad])
    fig.update_layout(
        title=title, xaxis_title=axis_title(x), yaxis_title="reward", height=380,
        margin={"l": 50, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.3},
    )  # fmt: skip
    fig.update_xaxes(type="date" if x == "wall time" else "linear")  # never guessed from the data
    if x == "step":
        integer_step_ticks(fig)
    return fig


def _bars(
    frame: pd.DataFrame,
    series: Sequence[tuple[str, str]],
    title: str,
    barmode: str,
    y_title: str,
    height: int,
) -> go.Figure:
    """Bars per step of the metrics ``series`` ((key, label) pairs) that the frame has; steps with none of
    them (step 0 is the eval alone) are left out."""
    keys = [key for key, _ in series if key in frame.columns]
    if not keys:
        return empty_figure(title)
    frame = frame.dropna(subset=keys, how="all")
    fig = go.Figure(
        [
            go.Bar(x=frame["step"], y=frame[key].fillna(0.0), name=label)
            for key, label in series
            if key in keys
        ]
    )
    fig.update_layout(
        barmode=barmode, title=title, xaxis_title="step", yaxis_title=y_title, height=height,
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
    )  # fmt: skip
    from app.metrics import integer_step_ticks

    integer_step_ticks(fig)
    return fig


def time_breakdown_figure(frame: pd.DataFrame, title: str = "Step time") -> go.Figure:
    """Stacked bars per step: sampling / reward / update forward / update backward (seconds)."""
    return _bars(frame, TIME_PHASES, title, "stack", "seconds", 320)


def pass_counts_figure(
    frame: pd.DataFrame, title: str = "Transformer passes in the update phase"
) -> go.Figure:
    """count/forward and count/backward per step (JAGG: two backward passes per window)."""
    return _bars(
        frame, (("count/forward", "forward"), ("count/backward", "backward")), title, "group", "passes", 300
    )


def probe_figure(
    probes: Sequence[Mapping[str, Any]],
    title: str = "Gradient cosine, JAGG vs exact",
    route_frac: float | None = None,
    threshold: float | None = None,
) -> go.Figure:
    """Cosine per group index (high noise first), one line per probed step and method.

    With automatic routing, ``threshold`` is drawn as a dashed line and the title says which groups the
    latest routing (``route_frac`` of the groups, high noise first) sends to JAGG.
    """
    if not probes:
        return empty_figure(title, "no probes (set probe_every > 0 or auto_route=true)")
    n_groups = len({p["group_index"] for p in probes})
    if route_frac is not None and route_frac == route_frac:  # not NaN
        n = round(route_frac * n_groups)
        title += f" — routed to JAGG: {f'groups 0–{n - 1}' if n else 'none'} of {n_groups}"
    frame = pd.DataFrame(list(probes))
    frame = frame.groupby(["method", "step", "group_index"], as_index=False)["cosine"].mean()
    fig = go.Figure()
    for (method, step), rows in frame.groupby(["method", "step"]):
        rows = rows.sort_values("group_index")
        fig.add_trace(
            go.Scatter(
                x=rows["group_index"], y=rows["cosine"], mode="lines+markers", name=f"{method} @ step {step}"
            )
        )
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", annotation_text=f"auto_route threshold {threshold:g}")
    fig.update_layout(
        title=title, xaxis_title="group (0 = highest noise)", yaxis_title="cosine", yaxis_range=[-1.05, 1.05],
        height=300, margin={"l": 50, "r": 20, "t": 50, "b": 40},
    )  # fmt: skip
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------------------------------------- speedup


def update_time(frame: pd.DataFrame, skip_first: bool = True) -> float | None:
    """Median update-phase seconds per step (time/update, else forward + backward); the first step is left
    out when there are others (it pays one-off warm-up costs)."""
    if "time/update" in frame.columns:
        series = frame["time/update"]
    elif {"time/update_forward", "time/update_backward"} <= set(frame.columns):
        series = frame["time/update_forward"] + frame["time/update_backward"]
    else:
        return None
    series = series.dropna()
    if skip_first and len(series) > 1:
        series = series.iloc[1:]
    return None if series.empty else float(series.median())


def paired_exact_run(store: RunStore, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The exact-backward run paired with ``run`` (linked either way by paired_run_id), if any."""
    candidates = []
    if run.get("paired_run_id") is not None:
        other = store.get_run(run["paired_run_id"])
        if other is not None:
            candidates.append(other)
    candidates += [r for r in store.list_runs() if r.get("paired_run_id") == run["id"]]
    for other in candidates:
        if other["config"].get("strategy") == "exact" and other["id"] != run["id"]:
            return other
    return None


def paired_run(store: RunStore, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The other run of ``run``'s pair (linked either way by paired_run_id, whatever its strategy), if any."""
    if run.get("paired_run_id") is not None:
        other = store.get_run(run["paired_run_id"])
        if other is not None and other["id"] != run["id"]:
            return other
    return next(
        (r for r in store.list_runs() if r.get("paired_run_id") == run["id"] and r["id"] != run["id"]), None
    )


# What makes an exact run a fair baseline of a run it was not paired with: the same model, the same batch
# (prompts × group, sampling steps) and the same eval.
BASELINE_KEYS = (
    "backbone", "model_path", "prompts_per_step", "group_size", "sampling_steps",
    "eval_prompts_file", "eval_num_prompts", "eval_seeds", "eval_every",
)  # fmt: skip


def speedup_baseline(
    store: RunStore, run: Mapping[str, Any], selection: Sequence[Mapping[str, Any]] = ()
) -> tuple[dict[str, Any] | None, str]:
    """The exact run ``run``'s measured speedup is against, and why: its own paired exact run ("paired"),
    else the first exact run of ``selection`` with the same batch and eval (:data:`BASELINE_KEYS`; "same
    batch and eval"). (None, "") for an exact run or when no exact run fits: a run is never measured
    against an exact run of another batch size."""
    cfg = run["config"]
    if cfg.get("strategy") == "exact":
        return None, ""
    paired = paired_exact_run(store, run)
    if paired is not None:
        return paired, "paired"
    for other in selection:
        if other["id"] != run["id"] and other["config"].get("strategy") == "exact":
            if all(other["config"].get(k) == cfg.get(k) for k in BASELINE_KEYS):
                return dict(other), "same batch and eval"
    return None, ""


def provisional(*runs: Mapping[str, Any] | None) -> str:
    """ "" when every run has ended; else ``provisional: #4 running`` naming the runs still going (a measured
    speedup moves until both runs of the pair end)."""
    going = [
        f"#{r['id']} {r['status']}" for r in runs if r is not None and r["status"] in ("running", "queued")
    ]
    return f"provisional: {', '.join(going)}" if going else ""


def prediction_baseline(config: Mapping[str, Any], exact_config: Mapping[str, Any] | None) -> str:
    """What a predicted speedup (:func:`config_speedup`) is over, in the same words in the form, Live and
    Compare: exact backward over the run's own trained steps, or the exact run's own trained steps when it
    trains another number a step (Flow-GRPO's whole SDE range against a window)."""
    try:
        mine = trained_steps(config)
        theirs = trained_steps(exact_config) if exact_config is not None else mine
    except (KeyError, TypeError, ValueError):
        return ""
    if theirs == mine:
        return f"exact backward over the same {mine} trained steps"
    return f"exact backward over its {theirs} trained steps (this run trains {mine})"


def speedup_frame(store: RunStore, run_id: int, r: float) -> pd.DataFrame:
    """One-row table: update-phase seconds/step of this run and of its paired exact run, how the pair was
    timed (side-by-side or sequential, ``runs.pair_mode``), the measured speedup (exact / this; "provisional:
    #4 running" while either run still trains, :func:`provisional`) and the cost-model prediction for this
    run's W, jagg_frac and ``r``, with what it is over (:func:`prediction_baseline`)."""
    run = store.get_run(run_id)
    if run is None:
        return pd.DataFrame()
    cfg = run["config"]
    mine = update_time(store.metrics_frame(run_id))
    exact = paired_exact_run(store, run) if cfg.get("strategy") != "exact" else None
    exact_time = update_time(store.metrics_frame(exact["id"])) if exact else None
    measured = exact_time / mine if exact_time and mine else None
    predicted = config_speedup(cfg, r, exact["config"] if exact else None)
    return pd.DataFrame(
        [
            {
                "run": f"#{run_id} ({cfg.get('strategy')})",
                "update s/step": _round(mine),
                "paired exact run": f"#{exact['id']}" if exact else "-",
                "pair timed": (run.get("pair_mode") or "-") if exact else "-",  # side-by-side | sequential
                "exact update s/step": _round(exact_time),
                "measured speedup": _round(measured, 3),
                "measured": (provisional(run, exact) or "final") if measured is not None else "-",
                "predicted speedup": _round(predicted, 3),
                "predicted over": prediction_baseline(cfg, exact["config"] if exact else None),
                "r": r,
            }
        ]
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


# ---------------------------------------------------------------------------------------------- compare


def compare_frame(store: RunStore, run_ids: Iterable[int], r: float) -> pd.DataFrame:
    """Per run: final reward, training time (:func:`training_duration`), total and per-step update-phase
    time, the measured speedup over its own baseline (:func:`speedup_baseline`: its paired exact run, else an
    exact run picked with the same batch and eval, named in "exact run"; "provisional: …" while either
    still trains) and the cost-model prediction with what it is over."""
    runs = [run for run in (store.get_run(i) for i in run_ids) if run is not None]
    finals = {r_["id"]: r_.get("final_reward") for r_ in store.list_runs()}
    frames = {run["id"]: store.metrics_frame(run["id"]) for run in runs}
    rows = []
    for run in runs:
        cfg = run["config"]
        frame = frames[run["id"]]
        per_step = update_time(frame)
        total = float(frame["time/update"].sum()) if "time/update" in frame.columns else None
        exact, why = speedup_baseline(store, run, runs)
        if exact is not None and exact["id"] not in frames:
            frames[exact["id"]] = store.metrics_frame(exact["id"])
        exact_time = update_time(frames[exact["id"]]) if exact is not None else None
        measured = _round(exact_time / per_step, 3) if exact_time and per_step else None
        exact_cfg = exact["config"] if exact is not None else None
        rows.append(
            {
                "run": run_label(run),
                "final reward": _round(finals.get(run["id"])),
                "training time (s)": _round(
                    training_duration(run, store.last_values(run["id"], TRAINING_CLOCK_KEYS)), 1
                ),
                "update time (s)": _round(total, 2),
                "update s/step": _round(per_step),
                "speedup vs exact": measured,
                "exact run": f"#{exact['id']} ({why})" if exact is not None else "-",
                "measured": (provisional(run, exact) or "final") if measured is not None else "-",
                "predicted": _round(config_speedup(cfg, r, exact_cfg), 3),
                "predicted over": prediction_baseline(cfg, exact_cfg)
                if cfg.get("strategy") != "exact"
                else "-",
            }
        )
    return pd.DataFrame(rows)


def config_diff(configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Fields whose values differ between runs (label → config dict): one row per field, one column per run."""
    labels = list(configs)
    keys = sorted({k for cfg in configs.values() for k in cfg})
    rows = []
    for key in keys:
        values = [configs[label].get(key) for label in labels]
        if any(v != values[0] for v in values[1:]):
            rows.append({"field": key, **{label: _show(v) for label, v in zip(labels, values)}})
    return pd.DataFrame(rows, columns=["field", *labels])


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


# ---------------------------------------------------------------------------------------------- images


def safe_image_path(
    run_dir: str | os.PathLike[str] | None, rel: str, runs_root: str | os.PathLike[str]
) -> str | None:
    """The absolute path of a sample image if it resolves (symlinks followed) to an existing image file
    inside ``runs_root``; None otherwise. The gallery shows nothing else."""
    if not run_dir:
        return None
    root = Path(runs_root).resolve()
    path = (Path(run_dir) / rel).resolve()
    if not path.is_relative_to(root) or path == root:
        return None
    if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
        return None
    return str(path)


class RunImages:
    """Finds a run's sample images by listing each of its folders once.

    A gallery asks for up to a few hundred relative paths; looking each one up costs a failed ``stat`` per
    missing file and a ``resolve`` per present one. Here a folder that is gone (the run folder, or a step's
    samples folder) is one failed listing and every image in it is skipped at once; only names that the
    listing holds go through :func:`safe_image_path` (symlinks followed, must stay inside the runs root).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None, runs_root: str | os.PathLike[str]):
        self.run_dir = Path(run_dir) if run_dir else None
        self.runs_root = runs_root
        self.exists = self.run_dir is not None and self.run_dir.is_dir()
        self._listings: dict[str, frozenset[str]] = {}

    def path(self, rel: str) -> str | None:
        """The absolute path of the image ``rel`` (relative to the run folder) if it is there and safe."""
        if not self.exists:
            return None
        parent, name = os.path.split(rel)
        names = self._listings.get(parent)
        if names is None:
            try:
                with os.scandir(self.run_dir / parent) as entries:
                    names = frozenset(e.name for e in entries)
            except OSError:
                names = frozenset()
            self._listings[parent] = names
        if name not in names:
            return None
        return safe_image_path(self.run_dir, rel, self.runs_root)


def _caption(sample: Mapping[str, Any], with_step: bool = True) -> str:
    parts = [f"step {sample['step']}"] if with_step else []
    parts.append(sample.get("prompt") or "")
    if sample.get("seed") is not None:
        parts.append(f"seed {sample['seed']}")
    if sample.get("reward") is not None:
        parts.append(f"reward {float(sample['reward']):.3f}")
    return " · ".join(p for p in parts if p)


def gallery_items(
    store: RunStore, run_id: int, runs_root: str | os.PathLike[str], kind: str = "eval", limit: int = 48
) -> list[tuple[str, str]]:
    """(image path, caption) of the run's samples, newest step first, then by prompt and seed; captions
    carry step, prompt, seed and reward. Paths outside the runs folder are dropped."""
    run = store.get_run(run_id)
    if run is None:
        return []
    images = RunImages(run["run_dir"], runs_root)
    if not images.exists:  # the run folder is gone: no image to look for
        return []
    samples = sorted(
        store.samples(run_id, kind), key=lambda s: (-s["step"], s.get("prompt") or "", s.get("seed") or 0)
    )
    items = []
    for s in samples:
        path = images.path(s["path"])
        if path is not None:
            items.append((path, _caption(s)))
        if len(items) >= limit:
            break
    return items


def side_by_side(
    store: RunStore, run_ids: Sequence[int], runs_root: str | os.PathLike[str], limit_pairs: int = 8
) -> list[tuple[str, str]]:
    """Eval images of the same prompt and seed from each run, at each run's last eval step, in rows of
    len(run_ids): [run A (p0, s0), run B (p0, s0), run A (p1, s0), …]. Only prompt+seed pairs every run
    has are shown."""
    per_run: list[dict[tuple[str, int], tuple[str, str]]] = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        images = RunImages(run["run_dir"] if run else None, runs_root)
        samples = store.samples(run_id, "eval") if images.exists else []
        if not samples:
            return []
        last = max(s["step"] for s in samples)
        found = {}
        for s in samples:
            if s["step"] != last:
                continue
            path = images.path(s["path"])
            if path is not None:
                found[(s.get("prompt") or "", s.get("seed") or 0)] = (
                    path,
                    f"#{run_id} {run['config'].get('strategy')} · " + _caption(s),
                )
        per_run.append(found)
    common = sorted(set.intersection(*(set(f) for f in per_run))) if per_run else []
    items = []
    for key in common[:limit_pairs]:
        items += [found[key] for found in per_run]
    return items


def _eval_images(
    runs: Sequence[Mapping[str, Any]],
    samples: Mapping[int, Sequence[Mapping[str, Any]]],
    runs_root: str | os.PathLike[str],
    wanted: Mapping[int, set[int]],
) -> dict[tuple[int, int], dict[tuple[str, int], tuple[str, str]]]:
    """(run id, step) → (prompt, seed) → (image path, caption) of each run's eval samples at its ``wanted``
    steps whose image file is there."""
    found: dict[tuple[int, int], dict[tuple[str, int], tuple[str, str]]] = {}
    for run in runs:
        images = RunImages(run["run_dir"], runs_root)  # a missing folder: its images skipped at once
        for s in samples[run["id"]]:
            if s["step"] not in wanted[run["id"]]:
                continue
            path = images.path(s["path"])
            if path is not None:
                found.setdefault((run["id"], s["step"]), {})[(s.get("prompt") or "", s.get("seed") or 0)] = (
                    path,
                    f"#{run['id']} {run['config'].get('strategy')} · " + _caption(s),
                )
    return found


def side_by_side_first_last(
    store: RunStore, run_ids: Sequence[int], runs_root: str | os.PathLike[str], limit_keys: int = 8
) -> list[tuple[str, str]]:
    """Eval images of the same prompt and seed from each run at the first and at the last eval step that all
    runs logged, one row per prompt+seed: [run A first, run B first, …, run A last, run B last, …] (a gallery
    of 2·len(run_ids) columns). Up to ``limit_keys`` prompt+seed pairs every run has at both steps, spread
    evenly over them in (prompt, seed) order — never chosen by reward."""
    runs = [store.get_run(run_id) for run_id in run_ids]
    if not runs or any(run is None for run in runs):
        return []
    samples = {run["id"]: store.samples(run["id"], "eval") for run in runs}
    step_sets = [{s["step"] for s in rows} for rows in samples.values()]
    common_steps = sorted(set.intersection(*step_sets)) if all(step_sets) else []
    if not common_steps:
        return []
    first, last = common_steps[0], common_steps[-1]
    found = _eval_images(runs, samples, runs_root, {run["id"]: {first, last} for run in runs})
    cells = [(run["id"], step) for step in dict.fromkeys((first, last)) for run in runs]
    keys = sorted(set.intersection(*(set(found.get(cell, {})) for cell in cells)))
    if not keys:
        return []
    stride = max(1, len(keys) // max(1, limit_keys))
    items = []
    for key in keys[::stride][:limit_keys]:
        items += [found[cell][key] for cell in cells]
    return items


def side_by_side_own_steps(
    store: RunStore,
    run_ids: Sequence[int],
    runs_root: str | os.PathLike[str],
    at: float | None = None,
    limit_keys: int = 8,
) -> tuple[list[tuple[str, str]], int]:
    """Eval images of the same prompt and seed from each run at ITS OWN first and last eval step (a 6-step
    run shows step 6 beside a 4-step run's step 4), and with ``at`` also at each run's logged eval step
    nearest ``at``, the columns in step order (the ``at`` images between first and last when they lie
    there): one row per prompt+seed, [A first, B first, …, A at, B at, …, A last, B last, …]. Returns
    (items, columns). Up to ``limit_keys`` prompt+seed pairs every cell has, spread evenly over them in
    (prompt, seed) order — never chosen by reward. Captions name the run and the step."""
    items, cells = own_step_cells(store, run_ids, runs_root, at, limit_keys)
    return items, len(cells)


def own_step_cells(
    store: RunStore,
    run_ids: Sequence[int],
    runs_root: str | os.PathLike[str],
    at: float | None = None,
    limit_keys: int = 8,
) -> tuple[list[tuple[str, str]], list[tuple[int, int]]]:
    """:func:`side_by_side_own_steps`'s items and its columns as (run id, eval step) pairs (a column of the
    same steps as another is left out: runs with one eval each show it once); ([], []) when the runs share
    no prompt+seed with an image in every column."""
    runs = [run for run in (store.get_run(i) for i in run_ids) if run is not None]
    if not runs:
        return [], []
    samples = {run["id"]: store.samples(run["id"], "eval") for run in runs}
    steps = {run["id"]: sorted({s["step"] for s in samples[run["id"]]}) for run in runs}
    if not all(steps.values()):
        return [], []
    picks = [lambda ss: ss[0], lambda ss: ss[-1]]
    if at is not None:
        picks.append(lambda ss: min(reversed(ss), key=lambda s: abs(s - float(at))))
    groups = [[(run, pick(steps[run["id"]])) for run in runs] for pick in picks]
    groups.sort(key=lambda group: sum(step for _, step in group) / len(group))  # stable: first, at, last
    unique = {tuple(step for _, step in group): group for group in groups}  # one eval only: shown once
    cells = [cell for group in unique.values() for cell in group]
    wanted = {run["id"]: {step for r, step in cells if r["id"] == run["id"]} for run in runs}
    found = _eval_images(runs, samples, runs_root, wanted)
    keys = sorted(set.intersection(*(set(found.get((r["id"], step), {})) for r, step in cells)))
    if not keys:
        return [], []
    stride = max(1, len(keys) // max(1, limit_keys))
    items = []
    for key in keys[::stride][:limit_keys]:
        items += [found[(r["id"], step)][key] for r, step in cells]
    return items, [(int(r["id"]), int(step)) for r, step in cells]


def reward_svg(
    frames: Mapping[str, pd.DataFrame], width: int = 900, height: int = 300, x_title: str = "step"
) -> str:
    """Each run's training reward per step (reward/mean, solid) and eval reward (eval/reward/mean, dashed, with
    dots) as a static SVG: the curves of :func:`reward_figure` without plotly, so a page shows them at its
    first paint. Polylines carry ``data-run`` (the label) and ``data-kind`` (train | eval). "" without data.
    The x is each frame's ``step`` column (a caller may put seconds there: ``x_title`` names the axis)."""
    series = []
    for i, (label, frame) in enumerate(frames.items()):
        for key, kind in (("reward/mean", "train"), ("eval/reward/mean", "eval")):
            if key in frame.columns:
                rows = frame[["step", key]].dropna()
                if not rows.empty:
                    series.append(
                        (label, _COLORS[i % len(_COLORS)], kind, list(rows["step"]), list(rows[key]))
                    )
    if not series:
        return ""
    xs = [float(x) for s in series for x in s[3]]
    ys = [float(y) for s in series for y in s[4]]
    x0, x1 = min(xs), max(xs)
    pad = max(0.05 * (max(ys) - min(ys)), 1e-3)
    y0, y1 = min(ys) - pad, max(ys) + pad
    left, right, top, bottom = 56, 16, 16, 56

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * (width - left - right)

    def py(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * (height - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
        'aria-label="reward per step" style="font: 12px sans-serif; background: #fff">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
    ]
    for y in (y0 + pad, (y0 + y1) / 2, y1 - pad):
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
    for x in sorted({x0, x1, round((x0 + x1) / 2)}):
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">{x:.4g}</text>')
    out.append(
        f'<text x="{(left + width - right) / 2}" y="{height - bottom + 32}" text-anchor="middle">{html.escape(x_title)}</text>'
    )
    for j, (label, color, kind, x, y) in enumerate(series):
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x, y))
        style = 'stroke-width="2.5" stroke-dasharray="6 4"' if kind == "eval" else 'stroke-width="1.5"'
        name = html.escape(f"{label} · {'eval' if kind == 'eval' else 'train'}")
        out.append(
            f'<polyline class="curve" data-run="{html.escape(label)}" data-kind="{kind}" fill="none" '
            f'stroke="{color}" {style} points="{points}"><title>{name}</title></polyline>'
        )
        if kind == "eval":
            out += [f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="4" fill="{color}"/>' for a, b in zip(x, y)]
        lx = left + 10 + j * 200
        out.append(
            f'<line x1="{lx}" y1="{height - 10}" x2="{lx + 24}" y2="{height - 10}" stroke="{color}" {style}/>'
            f'<text x="{lx + 30}" y="{height - 6}">{name}</text>'
        )
    return "".join(out) + "</svg>"


# ---------------------------------------------------------------------------------------------- timer


def run_signature(store: RunStore, run: Mapping[str, Any] | None) -> tuple:
    """What changes when a run's live view must be redrawn: status, last step, samples logged, log sizes.
    Cheap: the run row comes from a run list already read, the samples are counted through an index."""
    if run is None:
        return (None,)
    folder = Path(run["run_dir"] or ".")
    sizes = []
    for name in ("train.log", "stdout.log"):
        try:
            sizes.append((folder / name).stat().st_size)
        except OSError:
            sizes.append(-1)
    count, last = store.sample_count(run["id"])
    return (run["id"], run["status"], run["last_step"], count, last, *sizes)


def pair_signature(run: Mapping[str, Any] | None, runs: Sequence[Mapping[str, Any]]) -> tuple:
    """The status and last step of the run paired with ``run`` (linked either way), () without one: the view
    of a JAGG run that ended first is redrawn while its exact run trains on, so that the pair's measured
    speedup follows until both end instead of freezing at the value it had when JAGG ended."""
    if run is None:
        return ()
    for other in runs:
        if other["id"] != run["id"] and (
            other["id"] == run.get("paired_run_id") or other.get("paired_run_id") == run["id"]
        ):
            return ("pair", other["id"], other["status"], other.get("last_step"))
    return ()


class SharedTick:
    """The reads of the app's timer, done once per tick and shared by every open tab.

    Each tab's timer fires every few seconds; with N tabs, N timers would each run the queue and read the
    run list. Here the first caller in a tick does the work (:meth:`tick` runs the queue pass, :meth:`runs`
    reads the run list, :meth:`signature` a watched run's signature) and callers within ``max_age``
    seconds get the same result; concurrent callers wait for the read in flight instead of repeating it.
    """

    def __init__(
        self,
        store: RunStore,
        queue_tick: Callable[[], Any] | None = None,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.queue_tick = queue_tick
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.RLock()
        self._memo: dict[Hashable, tuple[float, Any]] = {}

    def _shared(self, key: Hashable, read: Callable[[], Any]) -> Any:
        with self._lock:
            now = self.clock()
            hit = self._memo.get(key)
            if hit is not None and 0 <= now - hit[0] < self.max_age:
                return hit[1]
            for old in [k for k, (t, _) in self._memo.items() if not 0 <= now - t < self.max_age]:
                del self._memo[old]  # runs no tab watches any more
            value = read()
            self._memo[key] = (now, value)
            return value

    def tick(self) -> None:
        """The queue pass (start queued runs, mark dead ones), at most once per ``max_age``."""
        if self.queue_tick is not None:
            self._shared("tick", self.queue_tick)

    def runs(self) -> list[dict[str, Any]]:
        """The run list (``store.list_runs()``) of this tick."""
        return self._shared("runs", self.store.list_runs)

    def signature(self, run_id: int | None) -> tuple:
        """:func:`run_signature` of ``run_id`` in this tick's run list, and its pair's (:func:`pair_signature`)."""
        if run_id is None:
            return (None,)

        def read() -> tuple:
            runs = self.runs()
            run = next((r for r in runs if r["id"] == run_id), None)
            return (*run_signature(self.store, run), *pair_signature(run, runs))

        return self._shared(("signature", run_id), read)


# ---------------------------------------------------------------------------------------------- logs


def log_tail(
    run_dir: str | os.PathLike[str] | None, lines: int = 40, max_bytes: int = 32_768, stdout: bool = False
) -> str:
    """The last lines of the run's train.log, else of stdout.log (what the subprocess printed); with
    ``stdout`` (a failed run: the traceback is there) stdout.log first."""
    if not run_dir:
        return ""
    for name in ("stdout.log", "train.log") if stdout else ("train.log", "stdout.log"):
        text = file_tail(Path(run_dir) / name, lines, max_bytes)
        if text.strip():
            return text
    return ""
