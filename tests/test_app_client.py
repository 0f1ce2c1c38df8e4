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


def _link_runs(root) -> None:
    """The shipped showcase (#1, #2) and two runs of the test's (#3 exact, #4 jagg) with loss/clipfrac."""
    from app import showcase
    from jagg_engine.store import open_store
    from jagg_engine.train.config import TrainConfig

    with open_store(root) as store:
        assert showcase.install(store, root) == [1, 2]
        for n, strategy in ((3, "exact"), (4, "jagg")):
            cfg = {
                **TrainConfig().to_dict(),
                "steps": 4,
                "strategy": strategy,
                "output_dir": str(root.resolve()),
            }
            assert store.create_run(strategy, cfg, None) == n
            store.set_status(n, "running", pid=None)
            for step in range(5):
                row = {"time/unix": 1000.0 + step, "eval/reward/mean": 0.3 + 0.01 * step, "reward/std": 0.4}
                store.log_step(n, step, row | ({"loss/clipfrac": 0.1 * step} if step else {}))
            store.set_status(n, "finished")


def test_a_compare_link_with_metrics_draws_the_linked_runs_and_so_does_the_metric_picks_redraw(tmp_path):
    """``?tab=compare&runs=3,4&metrics=loss/clipfrac``: the page load's function draws #3 and #4, and the
    redraw the metric pick's change sends right after it (the load set the metrics picked) draws them too,
    although the page sends that change with the runs picker's value from before the load (the showcase's)."""
    import types

    from app import ui

    root = tmp_path / "runs"
    _link_runs(root)
    demo = ui.build_app(root, background_ticks=False)
    try:
        h = demo.jagg_handlers
        load = next(f for f in demo.fns.values() if "loader" in getattr(f.fn, "__qualname__", ""))
        request = types.SimpleNamespace(
            query_params={"tab": "compare", "runs": "3,4", "metrics": "loss/clipfrac"}
        )
        after: dict = {}  # component id → its update (the metric pick is two outputs: value, then choices)
        for block, update in zip(load.outputs, load.fn(h.r0, request), strict=True):
            merged = after.get(block._id, {})
            after[block._id] = {**merged, **update} if isinstance(update, dict) else update
        metrics_plot = next(b for b in load.outputs if getattr(b, "elem_id", None) == "compare-metrics")
        names = [t.name for t in after[metrics_plot._id]["value"].data]
        assert names and all(
            n.startswith(("#3 exact · loss/clipfrac", "#4 jagg · loss/clipfrac")) for n in names
        )
        pick = next(b for b in load.outputs if getattr(b, "elem_id", None) == "compare-metric-pick")
        redraw = next(
            f for f in demo.fns.values() if f.fn and (pick._id, "change") in [(t[0], t[1]) for t in f.targets]
        )
        sent = []
        for block in redraw.inputs:
            value = after.get(block._id, {})
            value = value.get("value", block.value) if isinstance(value, dict) else value
            if getattr(block, "elem_id", None) == "compare-runs":
                value = block.value  # the picker as the page holds it when it sends the change: [1, 2]
                assert value == [1, 2]
            sent.append(value)
        assert sent[[b._id for b in redraw.inputs].index(pick._id)] == ["loss/clipfrac"]
        _, plot = redraw.fn(*sent)
        names = [t.name for t in plot["value"].data]
        assert names and all(
            n.startswith(("#3 exact · loss/clipfrac", "#4 jagg · loss/clipfrac")) for n in names
        )
    finally:
        demo.jagg_stop_ticker.set()
        demo.jagg_manager.shutdown()


def test_a_compare_link_without_metrics_draws_the_reward_spread_first(tmp_path):
    """``?tab=compare&runs=3,4``: the metrics plot beside the reward opens on the batch reward spread
    (reward/std), where JAGG's plateau shows, then clipfrac and grad/norm; the picker says so."""
    import types

    from app import ui

    root = tmp_path / "runs"
    _link_runs(root)
    demo = ui.build_app(root, background_ticks=False)
    try:
        load = next(f for f in demo.fns.values() if "loader" in getattr(f.fn, "__qualname__", ""))
        request = types.SimpleNamespace(query_params={"tab": "compare", "runs": "3,4"})
        out = dict(zip([b._id for b in load.outputs], load.fn(demo.jagg_handlers.r0, request), strict=False))
        metrics_plot = next(b for b in load.outputs if getattr(b, "elem_id", None) == "compare-metrics")
        names = [t.name for t in out[metrics_plot._id]["value"].data if "(raw)" not in t.name]
        assert names[0] == "#3 exact · reward/std" and "#4 jagg · reward/std" in names
        pick = next(b for b in load.outputs if getattr(b, "elem_id", None) == "compare-metric-pick")
        assert list(pick.value) == ["reward/std", "loss/clipfrac", "grad/norm"]
    finally:
        demo.jagg_stop_ticker.set()
        demo.jagg_manager.shutdown()


def test_the_first_screens_metric_controls_are_out_of_sight_until_compare_draws_its_plots(tmp_path):
    """The first screen (the showcase's static curves) shows no control that acts on no plot: Compare's x axis,
    smoothing, log scale, metrics and "runs shown" are out of sight (in the page, for its script) while its
    plots are hidden, and come in sight with them: after Compare of two runs or more, or a Compare link."""
    import types

    from app import ui

    root = tmp_path / "runs"
    _link_runs(root)
    demo = ui.build_app(root, background_ticks=False)
    try:
        h = demo.jagg_handlers
        by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
        assert by_id["compare-plot"].visible is False and by_id["compare-metrics"].visible is False
        controls = ["compare-x", "compare-smoothing", "compare-log-scale", "compare-metric-pick"]
        row = by_id["compare-view"]
        inside, todo = set(), list(row.children)
        while todo:  # the row's components, through gradio's form wrappers
            block = todo.pop()
            inside.add(block._id)
            todo += getattr(block, "children", [])
        assert {by_id[c]._id for c in controls} <= inside
        assert row.visible == "hidden" and by_id["compare-shown"].visible == "hidden"
        assert by_id["live-view"].visible is True  # Live's act on its plots, drawn from the start
        shown, drawn, shown_row = h.history.compare_drawn([3, 4])
        assert shown["visible"] is True and shown_row["visible"] is True and drawn == [3, 4]
        shown, _, shown_row = h.history.compare_drawn([3])  # "Pick two or more runs.": no plot, no control
        assert shown["visible"] == "hidden" and shown_row["visible"] == "hidden"
        load = next(f for f in demo.fns.values() if "loader" in getattr(f.fn, "__qualname__", ""))
        link = types.SimpleNamespace(query_params={"tab": "compare", "runs": "3,4"})
        after = dict(zip((b._id for b in load.outputs), load.fn(h.r0, link), strict=False))
        assert after[row._id]["visible"] is True
        plain = dict(zip((b._id for b in load.outputs), load.fn(h.r0, None), strict=False))
        assert plain[row._id] == {"__type__": "update"}  # a page with no link: left out of sight
    finally:
        demo.jagg_stop_ticker.set()
        demo.jagg_manager.shutdown()
