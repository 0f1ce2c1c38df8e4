"""app.client: the series each plot carries for the page's controls, and the view a query string names."""

from __future__ import annotations

import pandas as pd
import pytest

from app import client, data, metrics


def _frame(t0: float = 1000.0) -> pd.DataFrame:
    rows = []
    for step in range(0, 7):
        row = {"step": step, "time/unix": t0 + 10 * step}
        if step:
            row |= {"reward/mean": 0.1 * step, "loss/clipfrac": 0.05 * step, "grad/norm": 2.0 / step}
        if step % 3 == 0:
            row["eval/reward/mean"] = 0.2 + 0.1 * step
        rows.append(row)
    return pd.DataFrame(rows)


def test_every_trace_of_the_reward_and_metrics_figures_carries_its_series_on_the_three_axes():
    frames = {"#1 exact": _frame(1000.0), "#2 jagg": _frame(2000.0)}
    runs = {"#1 exact": {"started_at": 990.0}, "#2 jagg": {"started_at": 2000.0}}
    view = metrics.MetricView(smoothing=0.5)
    fig = client.attach(metrics.metrics_figure(frames, view, runs=runs), frames, runs)
    reward = client.attach(data.reward_figure(frames, runs=runs), frames, runs, "reward")
    for figure, kind in ((fig, "metrics"), (reward, "reward")):
        assert figure.layout.meta[client.META_KEY] == {"kind": kind}
        assert all(t.meta and client.META_KEY in t.meta for t in figure.data), [t.name for t in figure.data]
    by_name = {t.name: t.meta[client.META_KEY] for t in fig.data}
    clip = by_name["#1 exact · loss/clipfrac"]
    assert (clip["run"], clip["key"], clip["role"]) == ("#1 exact", "loss/clipfrac", "line")
    assert clip["step"] == [1, 2, 3, 4, 5, 6]
    assert clip["y"] == pytest.approx([0.05 * s for s in range(1, 7)])
    assert clip["wall"] == [1000_000.0 + 10_000.0 * s for s in range(1, 7)]  # Unix ms
    assert clip["rel"] == [10.0 + 10 * s for s in range(1, 7)]  # seconds since started_at (990)
    assert by_name["#2 jagg · grad/norm (raw)"]["role"] == "raw"
    evals = {t.name: t.meta[client.META_KEY] for t in reward.data}["#2 jagg · eval"]
    assert (evals["step"], evals["rel"], evals["role"]) == ([0, 3, 6], [0.0, 30.0, 60.0], "fixed")
    # the trailing mean keeps the values drawn (not the raw rewards)
    trend = next(t for t in reward.data if t.name == "#1 exact · total, mean of last 10 steps")
    assert trend.meta[client.META_KEY]["y"][-1] == pytest.approx(list(trend.y)[-1])


def test_a_long_curve_is_drawn_as_a_line_and_a_short_one_keeps_its_markers():
    long = pd.DataFrame({"step": range(1, 41), "grad/norm": [1.0 / s for s in range(1, 41)]})
    fig = client.attach(
        metrics.metrics_figure({"": long}, metrics.MetricView(("grad/norm",), 0.0)), {"": long}
    )
    assert [t.mode for t in fig.data] == ["lines"]
    short = client.attach(metrics.metrics_figure({"": _frame()}, metrics.MetricView(("grad/norm",), 0.0)),
                          {"": _frame()})  # fmt: skip
    assert [t.mode for t in short.data] == ["lines+markers"]


def test_the_view_of_a_query_string_keeps_what_parses_and_drops_the_rest():
    view = client.view_from_query(
        {"tab": "compare", "runs": "3,#4,x,3", "metrics": "loss/clipfrac, grad/norm", "x": "wall time",
         "smoothing": "0.8", "log": "1", "level": "0.5"}
    )  # fmt: skip
    assert view == {"tab": "compare", "runs": [3, 4], "metrics": ["loss/clipfrac", "grad/norm"],
                    "x": "wall time", "smoothing": 0.8, "log_y": True, "level": "0.5"}  # fmt: skip
    bad = {"tab": "nope", "run": "abc", "x": "time", "smoothing": "1.5", "log": "yes", "level": "0.5x"}
    assert client.view_from_query(bad) == {}
    assert client.view_from_query({"run": "#7"}) == {"run": 7}


def test_the_page_script_is_one_script_and_each_control_event_returns_no_outputs():
    assert client.SCRIPT.count("<script>") == 1 and "window.jaggView" in client.SCRIPT
    js = client.control_js(["compare-plot"], "compare", ["metrics", "smoothing", "log", "x", "shown"])
    assert js.startswith("(metrics, smoothing, log, x, shown) =>") and js.endswith("return []; }")
    assert "window.jaggView.apply(['compare-plot']" in js
    assert "apply(" not in client.control_js(
        ["live-metrics"], "live", ["metrics", "smoothing", "log", "x"], draw=False
    )
