"""The metrics view: any logged metric against step, wall time, relative time or training time (evals
excluded), smoothed, on a linear or log scale; and the time at which a run first reaches a reward level. Pure
functions (metrics frame → figure or table), no gradio: the Live and Compare tabs and tests call them.

Conventions follow the trackers practitioners know: one line per run and metric, an exponential moving
average with the raw curve faint behind it, x = Step | Wall time | Relative time (wandb's x-axis choices;
trackio draws one plot per logged metric key, so a new key needs no UI code), and Training time: the clock
of the time to reach a reward level, evals left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from jagg_engine.report.axes import (  # noqa: F401 (the app's names for them)
    AXIS_TITLES,
    WALL_KEY,
    axis_title,
    empty_figure,
    integer_step_ticks,
    training_seconds,
    x_values,
)

X_AXES = ("step", "wall time", "relative time", "training time")
DEFAULT_METRICS = ("loss/clipfrac", "grad/norm")
# Compare draws the batch reward spread first, beside the reward plot: where JAGG's plateau shows (docs/method.md)
COMPARE_METRICS = ("reward/std", *DEFAULT_METRICS)
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_DASHES = ("solid", "dash", "dot", "dashdot")


@dataclass(frozen=True)
class MetricView:
    """What the metrics view draws: ``metrics`` (logged keys), ``smoothing`` in [0, 1) (EMA weight of the
    past, 0 = raw), ``log_y``, ``x`` one of :data:`X_AXES`."""

    metrics: tuple[str, ...] = DEFAULT_METRICS
    smoothing: float = 0.6
    log_y: bool = False
    x: str = "step"


def check_view(metrics: Any, smoothing: Any, log_y: Any, x: Any) -> MetricView:
    """The controls' values → a MetricView; bad values raise ValueError in one line naming the control."""
    if metrics is None:
        metrics = ()
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) and m for m in metrics):
        raise ValueError(f"metrics: must be a list of logged metric names, got {metrics!r}")
    try:
        s = float(0.0 if smoothing is None else smoothing)
    except (TypeError, ValueError):
        s = math.nan
    if isinstance(smoothing, bool) or not 0.0 <= s < 1.0:
        raise ValueError(f"smoothing: must be a number from 0 to below 1, got {smoothing!r}")
    if x not in X_AXES:
        raise ValueError(f"x axis: must be one of {', '.join(X_AXES)}, got {x!r}")
    return MetricView(tuple(metrics), s, bool(log_y), str(x))


def metric_keys(frames: Sequence[pd.DataFrame]) -> list[str]:
    """Every metric key logged in any of the frames (the metric picker's choices), sorted; the step and the
    timestamp are axes, not metrics."""
    keys = {c for frame in frames for c in frame.columns if c not in ("step", WALL_KEY)}
    return sorted(keys)


def ema(values: Sequence[float], smoothing: float) -> np.ndarray:
    """Debiased exponential moving average: ``m_t = w·m_{t−1} + (1−w)·v_t``, divided by ``1 − w^t`` so the
    first points are not pulled toward 0 (TensorBoard's scalar smoothing, also wandb's "exponential moving
    average"). NaNs are skipped and stay NaN. ``smoothing`` = w in [0, 1); 0 gives the raw values."""
    out = np.full(len(values), np.nan)
    last, n = 0.0, 0
    for i, v in enumerate(values):
        if v is None or not math.isfinite(float(v)):
            continue
        n += 1
        last = smoothing * last + (1.0 - smoothing) * float(v)
        out[i] = last / (1.0 - smoothing**n) if smoothing > 0 else float(v)
    return out


LOG_NOTE = "jagg-log-note"  # the name of a note "no positive values for a log axis" (the page's script's too)


def log_note(key: str) -> str:
    """The note in the plot of metric ``key`` on a log scale when it has no positive value to place."""
    return f"{key}: no positive values for a log axis; untick log scale"


def _any_positive(frames: Mapping[str, pd.DataFrame], key: str) -> bool:
    return any(key in f.columns and (f[key].astype(float) > 0).any() for f in frames.values())


def metrics_figure(
    frames: Mapping[str, pd.DataFrame],
    view: MetricView,
    runs: Mapping[str, Mapping[str, Any]] | None = None,
    title: str = "Metrics",
) -> go.Figure:
    """``view.metrics`` of each run (label → metrics frame; ``runs``: label → run row, for the time axes), one
    stacked plot per metric sharing the x axis (trackio's one plot per key: a clip fraction and a gradient
    norm do not share a scale): the smoothed line bold, the raw values faint behind it (only when smoothed),
    a colour per run. Trace names: ``<label> · <metric>`` and ``… (raw)``. On a log scale, a metric with no
    positive value keeps its plot, empty, with a note saying so (:func:`log_note`)."""
    from plotly.subplots import make_subplots

    keys = [k for k in view.metrics if any(k in f.columns and f[k].notna().any() for f in frames.values())]
    if not keys:
        wanted = ", ".join(view.metrics)
        return empty_figure(title, f"not logged: {wanted}" if view.metrics else "pick a metric")
    # A log scale has no place for 0 or below: a metric without a positive value keeps its (empty) plot, with
    # a note in it saying so (the page, app.client.SCRIPT, writes the same notes when log scale is ticked).
    unplaced = [k for k in keys if view.log_y and not _any_positive(frames, k)]
    fig = make_subplots(rows=len(keys), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=keys)
    for i, (label, frame) in enumerate(frames.items()):
        color = _COLORS[i % len(_COLORS)]
        xs = x_values(frame, (runs or {}).get(label), view.x)
        for row, key in enumerate(keys, start=1):
            if key not in frame.columns:
                continue
            keep = frame[key].notna() & xs.notna()
            x, y = xs[keep], frame[key][keep].astype(float)
            if view.log_y:  # log scale: only positive values have a place
                pos = y > 0
                x, y = x[pos], y[pos]
            name = f"{label} · {key}" if label else key
            if view.smoothing > 0:
                fig.add_trace(
                    go.Scatter(
                        x=x, y=y, mode="lines", name=f"{name} (raw)", opacity=0.25, showlegend=False,
                        line={"color": color, "width": 1}, hoverinfo="skip",
                    ),
                    row=row, col=1,
                )  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    x=x, y=ema(list(y), view.smoothing), mode="lines+markers", name=name,
                    line={"color": color, "width": 2}, marker={"size": 4},
                ),
                row=row, col=1,
            )  # fmt: skip
    for row, key in enumerate(keys, start=1):
        if key in unplaced:
            fig.add_annotation(
                text=log_note(key), name=LOG_NOTE, showarrow=False, x=0.5, y=0.5,
                xref="x domain", yref="y domain", row=row, col=1,
            )  # fmt: skip
    fig.update_yaxes(type="log" if view.log_y else "linear")
    # The x axis's own type in every mode: dates for wall time, numbers otherwise (never plotly's guess from
    # an empty subplot, which reads −1…6).
    fig.update_xaxes(type="date" if view.x == "wall time" else "linear")
    fig.update_xaxes(title_text=axis_title(view.x), row=len(keys), col=1)
    title += f" (EMA {view.smoothing:g})" if view.smoothing else ""
    fig.update_layout(
        title=title,
        height=120 + 200 * len(keys), margin={"l": 60, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.5 / len(keys) - 0.05},
    )  # fmt: skip
    if view.x == "step":
        integer_step_ticks(fig)
    return fig


THEME_TEMPLATE = "jagg"


def use_page_theme() -> None:
    """Make :data:`THEME_TEMPLATE` plotly's default template: plotly's own with transparent paper and plot
    backgrounds and a grey grid, so that every figure drawn after sits on the page's light or dark
    background (the page's CSS, :data:`app.layout.CSS`, colours the figures' text in dark mode with the
    theme's text colour). The app calls it when it is built; nothing changes at import."""
    import plotly.io as pio

    if THEME_TEMPLATE not in pio.templates:
        template = go.layout.Template(pio.templates["plotly"])
        clear, grid = "rgba(0,0,0,0)", "rgba(128,128,128,0.25)"
        template.layout.update(paper_bgcolor=clear, plot_bgcolor=clear)
        for axis in ("xaxis", "yaxis"):
            template.layout[axis].update(gridcolor=grid, zerolinecolor=grid, linecolor=grid)
        pio.templates[THEME_TEMPLATE] = template
    pio.templates.default = THEME_TEMPLATE


# ---------------------------------------------------------------------------------------------- time to reach


EVAL_KEY = "eval/reward/mean"


def first_reach(frame: pd.DataFrame, level: float, key: str = EVAL_KEY) -> tuple[int, float] | None:
    """(step, training seconds) of the first logged ``key`` (eval reward by default) at or above ``level``;
    None if it never gets there. Training seconds exclude eval (:func:`training_seconds`)."""
    if key not in frame.columns:
        return None
    seconds = training_seconds(frame)
    hits = frame.index[frame[key].notna() & (frame[key] >= level)]
    if len(hits) == 0:
        return None
    row = hits[0]
    return int(frame.at[row, "step"]), float(seconds.at[row]) if seconds.notna().at[row] else math.nan


def final_eval(frame: pd.DataFrame, key: str = EVAL_KEY) -> float | None:
    """The run's last logged eval reward."""
    if key not in frame.columns:
        return None
    values = frame[key].dropna()
    return None if values.empty else float(values.iloc[-1])


def first_eval(frame: pd.DataFrame, key: str = EVAL_KEY) -> float | None:
    """The run's first logged eval reward (its step-0 eval: the model before training)."""
    if key not in frame.columns:
        return None
    values = frame[key].dropna()
    return None if values.empty else float(values.iloc[0])


def _levels(frames: Mapping[str, pd.DataFrame]) -> tuple[dict[str, float], str | None, float | None]:
    """(label → final eval of the runs with an eval, the label of the highest first eval, that eval)."""
    finals = {label: final_eval(frame) for label, frame in frames.items()}
    finals = {label: value for label, value in finals.items() if value is not None}
    firsts = {label: first_eval(frames[label]) for label in finals}
    start = max(firsts, key=lambda k: firsts[k]) if firsts else None
    return finals, start, (firsts[start] if start is not None else None)


def default_level(
    frames: Mapping[str, pd.DataFrame], strategies: Mapping[str, str] | None = None
) -> tuple[float, str] | None:
    """The reward level Compare measures time to by default, and a phrase saying whose it is: the lowest of
    the picked runs' final evals above every run's first eval. No run has it at its first eval (a level one
    run starts at would read "step 0, 0 s, 0 %"), and the run it is the final eval of reaches it (at its
    final eval at the latest); when every final is above the first evals it is the lower of the final evals,
    a level every run reaches. None without an eval, or when no final eval is above the first evals
    (:func:`no_default_level` says why). ``strategies`` (label → strategy) is not needed to choose it; it is
    kept for callers that pass it."""
    finals, start, first = _levels(frames)
    above = {label: value for label, value in finals.items() if first is not None and value > first}
    if not above:
        return None
    label = min(above, key=lambda k: above[k])
    if len(finals) == 1:
        return above[label], f"{label}'s final eval"
    if len(above) == len(finals):
        return above[label], f"the lower of the final evals, {label}'s"
    return above[label], f"the lowest final eval above the runs' first evals, {label}'s"


def no_default_level(frames: Mapping[str, pd.DataFrame]) -> str:
    """Why :func:`default_level` found none, in one line ("" when it found one, or no run has an eval)."""
    finals, start, first = _levels(frames)
    if not finals or default_level(frames) is not None:
        return ""
    return (
        f"No reward level by default: no final eval is above {start}'s first eval ({first:.4g}), a level it "
        "has from its start; type a level."
    )


def best_eval(frame: pd.DataFrame, key: str = EVAL_KEY) -> tuple[float, int, float] | None:
    """(best eval reward, its step, the training seconds there) of a run; None without an eval."""
    if key not in frame.columns or frame[key].notna().sum() == 0:
        return None
    row = frame[key].astype(float).idxmax()
    seconds = training_seconds(frame)
    return float(frame.at[row, key]), int(frame.at[row, "step"]), float(seconds.at[row])


def not_reached(frame: pd.DataFrame, key: str = EVAL_KEY) -> str:
    """``not reached (best 0.912 at step 30 / 41.5 s)``: what a run that never reaches the level did get."""
    best = best_eval(frame, key)
    if best is None:
        return "not reached (no eval logged)"
    value, step, seconds = best
    at = f"step {step}" + (f" / {seconds:.1f} s" if math.isfinite(seconds) else "")
    return f"not reached (best {value:.4g} at {at})"


def reach_frame(frames: Mapping[str, pd.DataFrame], level: float) -> pd.DataFrame:
    """Per run: the step and the training seconds (eval excluded) at which its eval reward first reaches
    ``level`` (a run that never does: ``not reached (best X at step N / t s)``, :func:`not_reached`), the
    total training seconds, the time fraction, and its final eval."""
    rows = []
    for label, frame in frames.items():
        hit = first_reach(frame, level)
        total = training_seconds(frame)
        total_s = float(total.iloc[-1]) if len(total) and total.notna().any() else None
        final = final_eval(frame)
        rows.append(
            {
                "run": label,
                "reaches at step": not_reached(frame) if hit is None else hit[0],
                "training time to reach (s)": "not reached" if hit is None else round(hit[1], 2),
                "of its training time": "-"
                if hit is None or not total_s
                else f"{100 * hit[1] / total_s:.0f} %",
                "final eval": None if final is None else round(final, 4),
            }
        )
    return pd.DataFrame(rows, columns=["run", "reaches at step", "training time to reach (s)",
                                       "of its training time", "final eval"])  # fmt: skip


# ---------------------------------------------------------------------------------------------- window


WINDOW_KEYS = ("sampler/window_start", "sampler/window_end")
SIGMA_KEYS = ("sampler/sigma_window_start", "sampler/sigma_window_end")


def window_figure(frame: pd.DataFrame, sampling_steps: int | None = None) -> go.Figure:
    """The trained SDE window per step: the band of sampling-step indices from ``sampler/window_start`` to
    ``sampler/window_end`` (end exclusive), high noise (index 0) at the top; and, where logged, the σ at the
    window's first step and after its last (``sampler/sigma_window_start`` / ``_end``) on a right-hand σ axis
    (σ = 1 at the top), so a pipeline schedule's σ shows beside its step indices."""
    title = "SDE window: sampling steps trained"
    if not set(WINDOW_KEYS) <= set(frame.columns):
        return empty_figure(title, "no sampler/window_start, sampler/window_end logged")
    rows = frame[["step", *WINDOW_KEYS]].dropna()
    if rows.empty:
        return empty_figure(title, "no sampler/window_start, sampler/window_end logged")
    start, end = rows["sampler/window_start"], rows["sampler/window_end"]
    fig = go.Figure(
        [
            go.Scatter(x=rows["step"], y=start, mode="lines", line={"shape": "hv", "color": "#1f77b4"},
                       name="window start"),
            go.Scatter(x=rows["step"], y=end, mode="lines", line={"shape": "hv", "color": "#1f77b4"},
                       fill="tonexty", fillcolor="rgba(31,119,180,0.25)", name="window end (excl.)"),
        ]
    )  # fmt: skip
    sigma_keys = [k for k in SIGMA_KEYS if k in frame.columns]
    for key, dash in zip(sigma_keys, ("dot", "dash")):
        sig = frame[["step", key]].dropna()
        label = "σ at start" if key.endswith("start") else "σ after end"
        fig.add_trace(go.Scatter(x=sig["step"], y=sig[key], mode="lines", yaxis="y2", name=label,
                                 line={"shape": "hv", "color": "#d62728", "dash": dash}))  # fmt: skip
    if sigma_keys:
        fig.update_layout(yaxis2={"title": "σ", "overlaying": "y", "side": "right", "range": [0, 1]})
    top = sampling_steps if sampling_steps else float(end.max())
    fig.update_layout(
        title=title, xaxis_title="step", yaxis_title="sampling step (0: σ = 1)", height=340,
        yaxis={"range": [top, 0], "dtick": 1}, margin={"l": 60, "r": 60, "t": 50, "b": 100},
        # the legend in the figure's bottom strip, below the x axis title (not over it) at any panel width
        legend={"orientation": "h", "yref": "container", "y": 0.01, "yanchor": "bottom", "x": 0},
    )  # fmt: skip
    integer_step_ticks(fig)
    return fig
