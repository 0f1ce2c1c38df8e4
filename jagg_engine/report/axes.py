"""The x axes every run figure shares (step, wall time, relative time, training time) and a figure with
nothing to draw yet. Used by the report and by the app's views."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

WALL_KEY = "time/unix"  # Unix seconds at the end of the step's update (the trainer's TrainingClock)


def training_seconds(frame: pd.DataFrame) -> pd.Series:
    """Seconds of training up to and including each step, eval excluded: the trainer's
    ``time/train_elapsed`` (the clock `jagg race` reads; 0 at step 0), or for a history logged before it the
    running sum of ``time/step`` (sampling + reward + update). NaN where nothing is logged."""
    if "time/train_elapsed" in frame.columns and frame["time/train_elapsed"].notna().any():
        seconds = frame["time/train_elapsed"].astype(float).copy()
        seconds[frame["step"] == 0] = 0.0
        return seconds
    if "time/step" not in frame.columns:
        return pd.Series(np.nan, index=frame.index)
    return frame["time/step"].fillna(0.0).cumsum()


def x_values(frame: pd.DataFrame, run: Mapping[str, Any] | None, x: str) -> pd.Series:
    """The x of each row of ``frame`` (one row per step, the whole history: the training time adds up):

    - ``step``: the step number;
    - ``wall time``: the clock time the step was logged (``time/unix``), as datetimes;
    - ``relative time``: seconds since the run started (``time/unix`` − the run's ``started_at``), evals
      included;
    - ``training time``: seconds of training, evals excluded (:func:`training_seconds`): the clock of
      Compare's time to reach a reward level and of `jagg race`.

    A run logged before ``time/unix`` existed falls back to its training time: the running sum of
    ``time/step`` (eval excluded), added to ``started_at`` for wall time. Rows without a time are NaN.
    """
    if x == "step":
        return frame["step"].astype(float)
    if x == "training time":
        return training_seconds(frame)
    started = float((run or {}).get("started_at") or 0.0)
    if WALL_KEY in frame.columns and frame[WALL_KEY].notna().any():
        stamps = frame[WALL_KEY].astype(float)
    elif "time/step" in frame.columns:
        stamps = started + frame["time/step"].fillna(0.0).cumsum()
        stamps[frame["step"] == 0] = started  # the eval before training
    else:
        return pd.Series(np.nan, index=frame.index)
    if x == "relative time":
        base = started if started else float(stamps.dropna().iloc[0]) if stamps.notna().any() else 0.0
        return stamps - base
    return pd.to_datetime(stamps, unit="s", utc=True)


AXIS_TITLES = {
    "step": "step",
    "wall time": "wall time",
    "relative time": "relative time (s)",
    "training time": "training time (s, evals excluded)",
}


def axis_title(x: str) -> str:
    return AXIS_TITLES[x]


def integer_step_ticks(fig: go.Figure) -> None:
    """Step axes tick at whole steps only (a step 2.5 does not exist): one tick per step over a short span,
    plotly's own (integer) spacing beyond it."""
    xs = [float(v) for t in fig.data for v in (t.x if t.x is not None else ()) if v is not None]
    if xs and max(xs) - min(xs) <= 12:
        fig.update_xaxes(tick0=0, dtick=1, tickformat="d")
    else:
        fig.update_xaxes(tickformat="d", nticks=12)


def empty_figure(title: str, note: str = "no data yet") -> go.Figure:
    """A figure with nothing to draw yet: its title and, in the middle, why (every panel's empty state)."""
    fig = go.Figure()
    fig.update_layout(
        title=title,
        annotations=[
            {"text": note, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}
        ],
        height=320,
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
        xaxis={"visible": False},
        yaxis={"visible": False},
    )
    return fig
