"""Runs as figures: reward curves (step means, ± std in the hover, eval dashed, a trend line), the step-time
breakdown, and a static SVG of the reward curves that needs no script."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from .axes import axis_title, empty_figure, integer_step_ticks, x_values

# Step-time phases, in the order they are stacked (bottom → top), with their labels.
TIME_PHASES = (
    ("time/sampling", "sampling"),
    ("time/reward", "reward"),
    ("time/probe", "probe"),  # the gradient-fidelity probe and auto_route's probe, not reward time
    ("time/update_forward", "update forward"),
    ("time/update_backward", "update backward"),
)


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


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


def switch_row(frame: pd.DataFrame) -> Any:
    """The index of the first row whose backward differs from the run's first rows' (``route/jagg`` 1 then 0:
    a ``jagg_until_step`` switch to the exact backward; 0 then 1: a ``jagg_from_step`` switch to JAGG), or None
    for a run that never changed strategy."""
    if "route/jagg" not in frame.columns:
        return None
    routed = frame["route/jagg"].dropna() > 0.5
    changed = routed[routed != routed.iloc[0]] if not routed.empty else routed
    return None if changed.empty else changed.index[0]


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
    ``<label> · <reward>``, ``<label> · total, mean of last N steps`` and ``<label> · eval``. A run that
    switched between JAGG and the exact backward (``jagg_until_step``, ``jagg_from_step``) has a dotted line at its
    first step after the switch.

    ``x``: the x axis, one of step, wall time, relative time (the app's X_AXES; ``runs``: label →
    run row, whose ``started_at`` the time axes need).
    """
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
        switch = switch_row(frame)
        if switch is not None and xs[switch] == xs[switch]:  # the strategy's change, on this run's colour
            where = xs[switch]
            fig.add_shape(
                type="line", x0=where, x1=where, y0=0, y1=1, yref="paper",
                line={"color": color, "dash": "dot", "width": 2},
            )  # fmt: skip
            step = int(frame.loc[switch, "step"])
            now = "JAGG" if frame.loc[switch, "route/jagg"] > 0.5 else "exact"
            fig.add_annotation(
                x=where, y=1, yref="paper", showarrow=False, xanchor="left", yanchor="top",
                text=f"{label + ': ' if label else ''}{now} from step {step}", font={"color": color},
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
    integer_step_ticks(fig)
    return fig


def time_breakdown_figure(frame: pd.DataFrame, title: str = "Step time") -> go.Figure:
    """Stacked bars per step: sampling / reward / update forward / update backward (seconds)."""
    return _bars(frame, TIME_PHASES, title, "stack", "seconds", 320)


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
