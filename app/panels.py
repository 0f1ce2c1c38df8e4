"""The Live tab's panels: one registry, from which the tab's layout, the live view's outputs and the timer's
refresh all derive.

A panel is a render function (the run being watched → a plotly figure, a table, gallery items or text) and its
place on the tab. Adding one is a call to :func:`register` in one module::

    @panels.register("grad-norm", label="gradient norm", place=(4, 2))
    def grad_norm(ctx: panels.LiveContext) -> go.Figure:
        return metric_lines_figure(ctx.frame, {"grad/norm": "norm"}, "Gradient norm", "L2 norm")

``place = (row, column)``: panels sharing a row number sit side by side, rows top to bottom, columns left to
right. The live view (``/live_view`` in the API) returns the progress line and then one value per panel in
the order panels were registered, so a new panel appends to the API's outputs and moves no existing one. The
registry is read when the app is built: a panel registered later shows in apps built after.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from app import data, metrics, samples
from jagg_engine.store import RunStore

KINDS = ("plot", "table", "gallery", "text")
Publish = Callable[[list[tuple[str, str]]], list[tuple[str, str]]]


@dataclass(frozen=True)
class LiveContext:
    """What a panel's render function may read: the run row, its metrics frame (one row per step, one column
    per metric key, read once for all panels), the store, the cost ratio r, the runs folder, ``publish``
    (gallery items → items gradio may serve) and ``view``, the metrics view's controls (metrics picked,
    smoothing, log scale, x axis: step, wall time, relative time or training time)."""

    store: RunStore
    run: Mapping[str, Any]
    frame: pd.DataFrame
    ratio: float
    runs_root: Path
    publish: Publish = lambda items: list(items)
    view: metrics.MetricView = field(default_factory=metrics.MetricView)


@dataclass(frozen=True)
class Panel:
    name: str
    render: Callable[[LiveContext], Any]
    kind: str
    label: str
    place: tuple[int, int]
    options: Mapping[str, Any] = field(default_factory=dict)  # extra keyword arguments of the component

    def component(self) -> gr.components.Component:
        """The gradio component that shows this panel (built inside the Live tab's Blocks context)."""
        elem_id = f"live-{self.name}"
        if self.kind == "plot":
            return gr.Plot(label=self.label, elem_id=elem_id, **self.options)
        if self.kind == "table":
            return gr.Dataframe(label=self.label, interactive=False, elem_id=elem_id, **self.options)
        if self.kind == "gallery":
            options = {"columns": 6, "height": "auto", **self.options}
            return gr.Gallery(label=self.label, elem_id=elem_id, **options)
        options = {"lines": 12, "max_lines": 20, "autoscroll": True, **self.options}
        return gr.Textbox(label=self.label, elem_id=elem_id, **options)

    def empty(self, note: str) -> Any:
        """The value shown when there is nothing to draw (no run picked, an error)."""
        if self.kind == "plot":
            return metrics.empty_figure(self.label[:1].upper() + self.label[1:], note)
        return {"table": pd.DataFrame(), "gallery": []}.get(self.kind, "")


_PANELS: dict[str, Panel] = {}


def register(
    name: str,
    *,
    label: str,
    place: tuple[int, int],
    kind: str = "plot",
    **options: Any,
) -> Callable[[Callable[[LiveContext], Any]], Callable[[LiveContext], Any]]:
    """Decorator: add ``render`` to the Live tab as panel ``name`` at ``place`` = (row, column). Raises
    ValueError for a taken name or place, or an unknown kind."""

    def add(render: Callable[[LiveContext], Any]) -> Callable[[LiveContext], Any]:
        if name in _PANELS:
            raise ValueError(f"panel: {name!r} is already registered")
        if kind not in KINDS:
            raise ValueError(f"panel {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        taken = next((p.name for p in _PANELS.values() if p.place == tuple(place)), None)
        if taken:
            raise ValueError(f"panel {name!r}: place {tuple(place)} is taken by {taken!r}")
        _PANELS[name] = Panel(name, render, kind, label, (int(place[0]), int(place[1])), options)
        return render

    return add


def unregister(name: str) -> None:
    """Remove panel ``name`` (apps already built keep showing it)."""
    if name not in _PANELS:
        raise KeyError(f"panel: no panel {name!r}; registered: {', '.join(_PANELS)}")
    del _PANELS[name]


def panels() -> list[Panel]:
    """Every registered panel, in registration order (the order of the live view's outputs)."""
    return list(_PANELS.values())


def rows(selected: list[Panel] | None = None) -> Iterator[list[Panel]]:
    """The panels grouped by row, top to bottom, each row left to right (the Live tab's layout)."""
    by_row: dict[int, list[Panel]] = {}
    for panel in sorted(selected if selected is not None else panels(), key=lambda p: p.place):
        by_row.setdefault(panel.place[0], []).append(panel)
    yield from by_row.values()


def render(panel: Panel, ctx: LiveContext) -> Any:
    """``panel.render(ctx)``; a panel that raises shows its error in its own place, not in the whole view."""
    try:
        return panel.render(ctx)
    except Exception as exc:  # a broken panel must not blank the live view
        return panel.empty(f"{panel.name} failed: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------- figures


def metric_lines_figure(
    frame: pd.DataFrame,
    series: Mapping[str, str],
    title: str,
    yaxis: str,
    scale: float = 1.0,
    from_zero: bool = False,
) -> go.Figure:
    """One line per metric key (``series``: key → legend name) over the steps that logged it, divided by
    ``scale``, the y axis from 0 with ``from_zero``; an empty figure saying so when none of the keys was
    logged. Steps tick at whole numbers."""
    fig = go.Figure()
    for key, name in series.items():
        if key in frame.columns:
            rows_ = frame[["step", key]].dropna()
            if not rows_.empty:
                fig.add_trace(
                    go.Scatter(x=rows_["step"], y=rows_[key] / scale, mode="lines+markers", name=name)
                )
    if not fig.data:
        return metrics.empty_figure(title, f"no {', '.join(series)} logged yet")
    fig.update_layout(
        title=title, xaxis_title="step", yaxis_title=yaxis, height=300,
        margin={"l": 50, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.25},
    )  # fmt: skip
    if from_zero:
        fig.update_yaxes(rangemode="tozero")
    metrics.integer_step_ticks(fig)
    return fig


MEMORY_SERIES = {"memory/peak_cuda_bytes": "peak CUDA memory", "memory/rss_bytes": "process RSS"}


def memory_figure(frame: pd.DataFrame) -> go.Figure:
    """Per step: the main process's peak CUDA memory in that step (GPU) and resident set size, in GiB."""
    return metric_lines_figure(frame, MEMORY_SERIES, "Memory", "GiB", scale=2**30, from_zero=True)


def seconds_per_step_figure(frame: pd.DataFrame) -> go.Figure:
    """Seconds per training step (time/step: sampling + reward + update; a step's eval is not in it) and
    the update phase alone (time/update)."""
    return metric_lines_figure(
        frame, {"time/step": "training step", "time/update": "update phase"}, "Seconds per step", "seconds"
    )


# ---------------------------------------------------------------------------------------------- built-in panels
# Registered in the order of the live view's outputs (the API's): new panels go at the end of this list.


def reward_series(ctx: LiveContext) -> tuple[dict[str, pd.DataFrame], dict[str, Mapping[str, Any]], str]:
    """(label → metrics frame, label → run row, title) of the Live reward panel: the run alone (label ""), or
    a run of a pair (Compare exact vs JAGG) and its pair, so that one Live view shows both runs."""
    run = ctx.run
    pair = data.paired_run(ctx.store, run)
    if pair is None:
        return {"": ctx.frame}, {"": run}, f"Reward — run #{run['id']}"
    mine = f"#{run['id']} {run['config'].get('strategy')}"
    theirs = f"#{pair['id']} {pair['config'].get('strategy')} (its pair)"
    frames = {mine: ctx.frame, theirs: ctx.store.metrics_frame(pair["id"])}
    return frames, {mine: run, theirs: pair}, f"Reward — run #{run['id']} and its pair #{pair['id']}"


@register("reward", label="reward", place=(1, 0))
def _reward(ctx: LiveContext) -> go.Figure:
    """The run's reward curves, its pair's overlaid (:func:`reward_series`)."""
    frames, runs, title = reward_series(ctx)
    return data.reward_figure(frames, title=title, x=ctx.view.x, runs=runs)


@register("time", label="step time", place=(1, 1))
def _time(ctx: LiveContext) -> go.Figure:
    return data.time_breakdown_figure(ctx.frame)


@register("speedup", label="update-phase speedup: measured vs predicted", place=(2, 0), kind="table")
def _speedup(ctx: LiveContext) -> pd.DataFrame:
    return data.speedup_frame(ctx.store, ctx.run["id"], ctx.ratio)


@register("passes", label="backward passes", place=(3, 0))
def _passes(ctx: LiveContext) -> go.Figure:
    return data.pass_counts_figure(ctx.frame)


@register("probe", label="gradient cosine per group", place=(3, 1))
def _probe(ctx: LiveContext) -> go.Figure:
    frame, config = ctx.frame, ctx.run["config"]
    routed = frame["route/jagg_frac"].dropna() if "route/jagg_frac" in frame else pd.Series([], dtype=float)
    return data.probe_figure(
        ctx.store.probes(ctx.run["id"]),
        route_frac=routed.iloc[-1] if len(routed) else None,
        threshold=config.get("auto_route_threshold") if config.get("auto_route") else None,
    )


@register(
    "gallery",
    label="first eval: where the run started (the step slider below shows the newest and any other step)",
    place=(6, 0),
    kind="gallery",
)
def _gallery(ctx: LiveContext) -> list[tuple[str, str]]:
    """The run's first eval images once a later eval exists: the slider shows the newest step, so the same
    images are never on the tab twice (with one eval so far, the slider alone shows it)."""
    if len(samples.sample_steps(ctx.store, ctx.run["id"], "eval")) < 2:
        return []
    _, items = samples.step_gallery(ctx.store, ctx.run["id"], ctx.runs_root, "eval", step=0)
    return ctx.publish(items)


@register("log", label="log", place=(9, 0), kind="text")
def _log(ctx: LiveContext) -> str:
    run = ctx.run
    log = data.log_tail(run["run_dir"], stdout=run["status"] == "failed")
    return run["error"] if run["status"] == "failed" and run.get("error") and not log else log


@register("memory", label="memory", place=(4, 0))
def _memory(ctx: LiveContext) -> go.Figure:
    return memory_figure(ctx.frame)


@register("seconds", label="seconds per step", place=(4, 1))
def _seconds(ctx: LiveContext) -> go.Figure:
    return seconds_per_step_figure(ctx.frame)


@register("metrics", label="metrics: any logged metric (pick it above)", place=(5, 0))
def _metrics(ctx: LiveContext) -> go.Figure:
    """The metrics view: every metric the trainer logs can be drawn here, none needs a panel of its own."""
    return metrics.metrics_figure({"": ctx.frame}, ctx.view, runs={"": ctx.run}, title="Metrics")


@register("window", label="SDE window position", place=(5, 1))
def _window(ctx: LiveContext) -> go.Figure:
    return metrics.window_figure(ctx.frame, ctx.run["config"].get("sampling_steps"))


@register("spread", label="reward spread (the batch's std), beside its pair's", place=(1, 2))
def _spread(ctx: LiveContext) -> go.Figure:
    """The std of each step's rewards over the batch, the run's and its pair's: under JAGG it has been seen to
    grow late in a run while the exact backward's shrinks (docs: the method, "The plateau"); a run that stops
    learning while its samples grow apart shows it here first."""
    frames, _, _ = reward_series(ctx)
    fig = go.Figure()
    for name, frame in frames.items():
        if "reward/std" in frame.columns:
            rows_ = frame[["step", "reward/std"]].dropna()
            if not rows_.empty:
                label = name or f"#{ctx.run['id']}"
                fig.add_trace(go.Scatter(x=rows_["step"], y=rows_["reward/std"], mode="lines", name=label))
    if not fig.data:
        return metrics.empty_figure("Reward spread", "no reward/std logged yet")
    fig.update_layout(
        title="Reward spread: std of one step's rewards", xaxis_title="step", yaxis_title="std", height=300,
        margin={"l": 50, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.25},
    )  # fmt: skip
    return fig


BIAS_SERIES = {
    "bias/rel_live": "‖bias‖ / ‖E g_exact‖",
    "bias/along_live": "bias along E g_exact (negative: shrinks it)",
}


@register("bias", label="JAGG's expected-gradient bias (from the probes)", place=(2, 1))
def _bias(ctx: LiveContext) -> go.Figure:
    """LiveBias's figures on probe steps: products of neighbouring probes' exact and JAGG gradients, unbiased
    for the products of their expectations, averaged (docs: the bias study); a run without probes says so."""
    if not any(key in ctx.frame.columns for key in BIAS_SERIES):
        return metrics.empty_figure(
            "Expected-gradient bias",
            "not measured: a JAGG run with probe_every measures it on its probe steps",
        )
    return metric_lines_figure(ctx.frame, BIAS_SERIES, "Expected-gradient bias (live)", "× ‖E g_exact‖")


def live_context(
    store: RunStore,
    run: Mapping[str, Any],
    ratio: float,
    runs_root: str | os.PathLike[str],
    publish: Publish,
    view: metrics.MetricView | None = None,
) -> LiveContext:
    """The context of one live view: the metrics frame read once for every panel."""
    frame = store.metrics_frame(run["id"])
    return LiveContext(store, run, frame, ratio, Path(runs_root), publish, view or metrics.MetricView())
