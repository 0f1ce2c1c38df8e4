"""Live's plots sent once, then only their new points (app.stream): the delta of a tick rebuilds, applied to
the figure the page holds, exactly the figure a whole redraw sends; a change that is not an append sends the
figure whole; a metric picked moves what the session holds. The page's side (jaggView.extend) is walked in
Chromium by tests/test_app_views_browser.py."""

from __future__ import annotations

import copy
import json

import plotly.graph_objects as go
import pytest

from app import stream, ui
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig


def _get(obj, path):
    for key in path.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _set(obj, path, value):
    *inner, last = path.split(".")
    for key in inner:
        obj = obj.setdefault(key, {})
    obj[last] = value


def _applied(figure: dict, change: dict) -> dict:
    """What the page does with a delta (jaggView.extend), on plain JSON: append, set, relayout."""
    out = copy.deepcopy(figure)
    assert len(out["data"]) == change["n"]
    for trace in change["traces"]:
        held = out["data"][trace["i"]]
        for path, tail in trace["append"].items():
            _set(held, path, list(_get(held, path) or []) + tail)
        for path, value in trace["set"].items():
            _set(held, path, value)
    for path, value in change["layout"].items():
        _set(out["layout"], path, value)
    return out


def _log(store, run_id: int, step: int) -> None:
    row = {"reward/mean": 0.01 * step, "reward/std": 0.002 * step, "time/step": 1.0 + step % 3,
           "time/sampling": 0.4, "time/update": 0.5, "time/unix": 1.7e9 + 2.0 * step,
           "time/train_elapsed": 2.0 * step, "loss/policy": 1.0 / step, "grad/norm": 0.5 + 0.01 * step}  # fmt: skip
    if step % 5 == 0:
        row["eval/reward/mean"] = 0.3 + 0.004 * step
    store.log_step(run_id, step, row)


@pytest.fixture
def app(tmp_path):
    """An app over one running run of 29 logged steps (an eval every 5); ``log(step)`` logs one more."""
    root = tmp_path / "runs"
    store = open_store(root)
    config = {**TrainConfig().to_dict(), "output_dir": str(root.resolve())}
    run_id = store.create_run("r", config, root / "run-0001")
    store.set_status(run_id, "running", pid=None)
    for step in range(1, 30):
        _log(store, run_id, step)
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    clock = [0.0]
    demo.jagg_shared.clock = lambda: clock[0]

    def log(step: int) -> None:
        _log(store, run_id, step)
        clock[0] += 10.0  # a new tick: nothing read before is reused

    try:
        yield demo, run_id, log
    finally:
        demo.jagg_manager.shutdown()
        store.close()


def _fn(demo, name: str):
    return next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", None) == name)


def _split(outputs, panels):
    """on_tick's outputs → (progress, {panel: value}, delta, drawn) (app/ui.py's order)."""
    values = dict(zip((p.name for p in panels), outputs[1 : 1 + len(panels)], strict=True))
    return outputs[0], values, outputs[1 + len(panels)], outputs[2 + len(panels)]


def _first_tick(demo, run_id):
    """The tick handler, the handlers, the Live panels and the outputs of a first tick (a tab's first draw)."""
    on_tick, handlers = _fn(demo, "on_tick"), demo.jagg_handlers
    return on_tick, handlers, handlers.panels, on_tick(run_id, 1.8, None, None)


def _skipped(value) -> bool:
    return type(value).__name__ == "skip" or value == {"__type__": "update"}


def test_a_tick_sends_each_plot_only_its_new_points_which_rebuild_the_whole_redraw(app):
    demo, run_id, log = app
    on_tick, handlers, panels, first = _first_tick(demo, run_id)
    _, values, delta, drawn = _split(first, panels)
    assert _skipped(delta)  # the first draw is whole
    figures = {name: v for name, v in values.items() if isinstance(v, go.Figure)}
    assert {"reward", "time", "metrics"} <= set(figures)
    assert set(drawn["panels"]) == set(figures) and drawn["run"] == run_id
    for name, fig in figures.items():  # the page reads which figure it holds from layout.meta
        assert fig.layout.meta["jagg"]["rev"] == drawn["panels"][name]["rev"]
    whole_bytes = sum(len(fig.to_json()) for fig in figures.values())

    seen, list_seen = first[-3], first[-1]
    for step in (30, 31):  # two steps, and an eval: the reward plot's eval line grows too
        log(step)
    second = on_tick(run_id, 1.8, seen, list_seen, None, "eval", *_view_defaults(), drawn)
    _, values, delta, held = _split(second, panels)
    assert delta["run"] == run_id and {"live-reward", "live-time", "live-metrics"} <= set(delta["plots"])
    # applied to what the page held, each delta is the figure a whole redraw sends now
    redraw = handlers.live.streamed_view(run_id, 1.8)
    whole = {p.name: v for p, v in zip(panels, redraw[1 : 1 + len(panels)], strict=True)}
    for name, fig in whole.items():
        if not isinstance(fig, go.Figure):
            continue
        plain = stream.plain(fig)
        assert held["panels"][name]["rev"] == plain["layout"]["meta"]["jagg"]["rev"], name
        change = delta["plots"].get(f"live-{name}")
        if change is None:  # unchanged: the page keeps its figure, which is this one
            assert _skipped(values[name]) and drawn["panels"][name]["figure"] == plain, name
            continue
        assert _skipped(values[name]), name  # the component gets nothing whole
        assert change["from"] == drawn["panels"][name]["rev"] and change["to"] == held["panels"][name]["rev"]
        assert _applied(drawn["panels"][name]["figure"], change) == plain, name
    eval_trace = next(
        t
        for t in delta["plots"]["live-reward"]["traces"]
        if str(whole["reward"].data[t["i"]].name).endswith("eval")
    )  # the eval line: a point at step 30 with its training seconds
    appended = eval_trace["append"]
    assert appended["meta.jagg.step"] == [30] and appended["meta.jagg.train"] == [60.0]
    sent = len(json.dumps(delta))
    assert sent * 10 < whole_bytes, (sent, whole_bytes)  # a tick sends a few points, not the figures


def _view_defaults():
    from app import metrics

    return list(metrics.DEFAULT_METRICS), 0.6, False, "step"


def test_a_change_that_is_not_an_append_sends_the_figure_whole():
    def fig(ys, name="a", mode="lines+markers", extra=None):
        f = go.Figure(go.Scatter(x=list(range(len(ys))), y=ys, name=name, mode=mode))
        for trace in extra or []:
            f.add_trace(trace)
        f.update_yaxes(range=[min(ys), max(ys)])
        return stream.plain(f)

    base = fig([1.0, 2.0, 3.0])
    grown = fig([1.0, 2.0, 3.0, 5.0], mode="lines")
    change = stream.delta(base, grown)
    assert change["traces"] == [{"i": 0, "append": {"x": [3], "y": [5.0]}, "set": {"mode": "lines"}}]
    assert change["layout"] == {"yaxis.range": [1.0, 5.0]} and _applied(base, change) == grown
    assert stream.delta(base, base) == {"n": 1, "traces": [], "layout": {}}
    assert stream.delta(base, fig([1.0, 2.5, 3.0, 5.0])) is None  # a point rewritten
    assert stream.delta(base, fig([1.0, 2.0])) is None  # points gone
    assert stream.delta(base, fig([1.0, 2.0, 3.0], name="b")) is None  # another trace in its place
    assert stream.delta(base, fig([1.0, 2.0, 3.0], extra=[go.Scatter(y=[1])])) is None  # a trace added
    assert stream.delta(None, base) is None
    # numpy arrays arrive as plotly's binary arrays: decoded, NaN as None, and compared point by point
    import numpy as np

    binary = stream.plain(go.Figure(go.Scatter(y=np.array([1.0, np.nan, 2.0]))))
    assert binary["data"][0]["y"] == [1.0, None, 2.0]
    # the revision ignores its own stamp: a stamped figure has the revision of the figure it was stamped on
    stamped, plain, rev = stream.stamp(go.Figure(go.Scatter(y=[1, 2])))
    assert stream.revision(plain) == rev == stamped.layout.meta["jagg"]["rev"]
    assert stream.revision(stream.plain(go.Figure(go.Scatter(y=[1, 3])))) != rev


def test_a_metric_picked_moves_what_the_session_holds_so_the_next_tick_extends_it(app):
    demo, run_id, log = app
    on_tick, handlers, panels, first = _first_tick(demo, run_id)
    _, _, _, drawn = _split(first, panels)
    picked = ["loss/policy", "grad/norm"]
    fig, held = handlers.live.panel_drawn("metrics", run_id, 1.8, picked, 0.6, False, "step", drawn)
    assert isinstance(fig, go.Figure) and held["panels"]["metrics"]["rev"] == fig.layout.meta["jagg"]["rev"]
    assert held["panels"]["metrics"]["rev"] != drawn["panels"]["metrics"]["rev"]
    assert held["panels"]["reward"] == drawn["panels"]["reward"]  # the other panels as they were
    log(30)
    second = on_tick(run_id, 1.8, first[-3], first[-1], None, "eval", picked, 0.6, False, "step", held)
    _, values, delta, _ = _split(second, panels)
    change = delta["plots"]["live-metrics"]
    assert _skipped(values["metrics"]) and change["from"] == held["panels"]["metrics"]["rev"]
    assert _applied(held["panels"]["metrics"]["figure"], change)["data"][0]["name"] == fig.data[0].name


def test_a_plot_the_page_holds_that_is_not_the_one_last_sent_is_sent_whole_by_the_next_tick(app):
    """Two answers that land in another order than they were written leave the page holding another figure
    than the session's record says; a plot that no longer changes gets no delta to catch it. The tick carries
    what the page's plots hold: a plot that differs is sent whole, even on a tick with nothing new."""
    demo, run_id, log = app
    on_tick, handlers, panels, first = _first_tick(demo, run_id)
    _, _, _, drawn = _split(first, panels)
    seen, list_seen = first[-3], first[-1]
    page = {f"live-{name}": entry["rev"] for name, entry in drawn["panels"].items()}

    def tick(held):
        return _split(
            on_tick(run_id, 1.8, seen, list_seen, None, "eval", *_view_defaults(), drawn, held), panels
        )

    # the page holds what was sent, or says nothing (no script): nothing new, nothing sent
    for held in (page, None, {}):
        _, values, delta, kept = tick(held)
        assert _skipped(delta) and all(_skipped(v) for v in values.values()) and kept == drawn
    # the page's metrics plot holds another figure: that plot alone is sent whole, and the record follows
    _, values, delta, kept = tick({**page, "live-metrics": "0123456789abcdef"})
    assert isinstance(values["metrics"], go.Figure), values["metrics"]
    assert values["metrics"].layout.meta["jagg"]["rev"] == drawn["panels"]["metrics"]["rev"]
    # marked as sent anew (the page redraws a plot only for a value unlike the last whole one it got), outside
    # the revision and the record
    assert values["metrics"].layout.meta["jagg"]["sent"] >= 1
    assert "sent" not in kept["panels"]["metrics"]["figure"]["layout"]["meta"]["jagg"]
    assert kept["panels"]["metrics"]["rev"] == drawn["panels"]["metrics"]["rev"]
    assert all(_skipped(values[name]) for name in drawn["panels"] if name != "metrics")  # the other plots
    assert _skipped(delta)
    # with new steps, the plot that differs comes whole and the others as their new points
    log(30)
    _, values, delta, _ = tick({**page, "live-metrics": "0123456789abcdef"})
    assert isinstance(values["metrics"], go.Figure) and "live-metrics" not in delta["plots"]
    assert _skipped(values["reward"]) and "live-reward" in delta["plots"]
