"""The studio's read side and handlers without a browser: the metrics view (EMA, log scale, time axes), time
to reach a reward level, the SDE-window panel, exact run pickers, confirmation before Cancel / Resume / Delete,
compare pairs validated as a pair, an honest Compare, and the step slider following a new eval."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from app import client, data, form, metrics, panels, ui
from app.report import _runs_section
from jagg_engine.store import open_store
from jagg_engine.train.config import ConfigError, TrainConfig

REPO = Path(__file__).resolve().parents[1]


def _handler(demo, name: str):
    return next(
        f.fn for f in demo.fns.values() if f.api_name == name or getattr(f.fn, "__name__", None) == name
    )


def _skipped(value) -> bool:
    return isinstance(value, dict) and value == {
        "__type__": "update"
    }  # gr.skip(): the component keeps its value


def _png(path: Path, color) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)


def _log_eval(store, root: Path, run_id: int, step: int, color) -> None:
    rows = []
    for prompt in ("a circle", "b square"):
        rel = f"samples/eval/step_{step:05d}/{prompt[0]}_seed0.png"
        _png(root / f"run-{run_id:04d}" / rel, color)
        rows.append({"kind": "eval", "prompt": prompt, "seed": 0, "reward": 0.5, "path": rel})
    store.log_samples(run_id, step, rows)


def _run(
    store, root: Path, name: str, steps: int, strategy: str = "jagg", evals: tuple[int, ...] = ()
) -> int:
    """A finished run of ``steps`` steps: metrics every step (clock time 10 s apart), eval images at ``evals``."""
    cfg = {**TrainConfig().to_dict(), "steps": steps, "strategy": strategy, "output_dir": str(root.resolve())}
    run_id = store.create_run(name, cfg, None)
    (root / f"run-{run_id:04d}").mkdir(parents=True)
    store.set_run_dir(run_id, root / f"run-{run_id:04d}")
    store.set_status(run_id, "running", pid=None)
    t0 = 1_700_000_000.0
    for step in range(steps + 1):
        row = {"time/unix": t0 + 10 * step}
        if step:
            row |= {
                "reward/mean": 0.1 * step,
                "loss/clipfrac": 0.01 * step,
                "grad/norm": 1.0 / step,
                "time/step": 8.0,
            }
        if step in evals:
            row["eval/reward/mean"] = (0.2 if strategy == "exact" else 0.3) * step
            _log_eval(store, root, run_id, step, (30 * step, 0, 0))
        store.log_step(run_id, step, row)
    store.set_times(run_id, t0 - 5, t0 - 5, t0 + 10 * steps)
    store.set_status(run_id, "finished")
    return run_id


# ---------------------------------------------------------------------------------------------- metrics view


def test_ema_is_debiased_and_zero_smoothing_is_the_raw_curve():
    # m1 = 0.5·0 = 0 → 0 / (1 − 0.5) = 0; m2 = 0.5·0 + 0.5·1 = 0.5 → 0.5 / (1 − 0.25) = 2/3 (by hand)
    np.testing.assert_allclose(metrics.ema([0.0, 1.0], 0.5), [0.0, 2 / 3])
    np.testing.assert_allclose(metrics.ema([3.0, 3.0, 3.0], 0.9), [3.0, 3.0, 3.0])  # no pull toward 0
    np.testing.assert_allclose(metrics.ema([1.0, 5.0, 2.0], 0.0), [1.0, 5.0, 2.0])
    out = metrics.ema([1.0, float("nan"), 3.0], 0.5)
    assert np.isnan(out[1]) and out[2] == pytest.approx((0.25 + 1.5) / 0.75)


def test_bad_view_controls_are_one_line_naming_the_control():
    with pytest.raises(ValueError, match=r"smoothing: must be a number from 0 to below 1, got 1\.0"):
        metrics.check_view(["grad/norm"], 1.0, False, "step")
    with pytest.raises(
        ValueError, match="x axis: must be one of step, wall time, relative time, training time, got 'time'"
    ):
        metrics.check_view(["grad/norm"], 0.5, False, "time")
    with pytest.raises(ValueError, match="metrics: must be a list of logged metric names"):
        metrics.check_view([3], 0.5, False, "step")


def test_metrics_figure_smooths_over_a_faint_raw_curve_on_log_or_time_axes():
    frame = pd.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "loss/clipfrac": [np.nan, 0.0, 0.2, 0.1],
            "grad/norm": [np.nan, 4.0, 1.0, 2.0],
            "time/step": [np.nan, 8.0, 8.0, 8.0],
            "time/unix": [100.0, 110.0, 120.0, 135.0],
        }
    )
    run = {"started_at": 95.0}
    view = metrics.MetricView(("loss/clipfrac", "grad/norm"), 0.5, False, "step")
    fig = metrics.metrics_figure({"#1": frame}, view, runs={"#1": run})
    names = [t.name for t in fig.data]
    assert names == [
        "#1 · loss/clipfrac (raw)",
        "#1 · loss/clipfrac",
        "#1 · grad/norm (raw)",
        "#1 · grad/norm",
    ]
    raw, smooth = fig.data[2], fig.data[3]
    assert raw.opacity == 0.25 and list(raw.y) == [4.0, 1.0, 2.0]
    np.testing.assert_allclose(smooth.y, metrics.ema([4.0, 1.0, 2.0], 0.5))
    assert list(smooth.x) == [1.0, 2.0, 3.0] and fig.layout.xaxis.dtick == 1  # whole steps only
    # smoothing 0: the raw values only, drawn once
    fig0 = metrics.metrics_figure({"#1": frame}, metrics.MetricView(("grad/norm",), 0.0, False, "step"))
    assert [list(t.y) for t in fig0.data] == [[4.0, 1.0, 2.0]]
    # log scale: a log axis, and the value 0 (no place on it) left out
    log = metrics.metrics_figure({"#1": frame}, metrics.MetricView(("loss/clipfrac",), 0.0, True, "step"))
    assert log.layout.yaxis.type == "log" and list(log.data[0].y) == [0.2, 0.1]
    # wall time: the step's clock time; relative time: seconds since the run started
    wall = metrics.metrics_figure(
        {"#1": frame}, metrics.MetricView(("grad/norm",), 0.0, False, "wall time"), {"#1": run}
    )
    assert [pd.Timestamp(x).timestamp() for x in wall.data[0].x] == [110.0, 120.0, 135.0]
    rel = metrics.metrics_figure(
        {"#1": frame}, metrics.MetricView(("grad/norm",), 0.0, False, "relative time"), {"#1": run}
    )
    assert list(rel.data[0].x) == [15.0, 25.0, 40.0] and rel.layout.xaxis.title.text == "relative time (s)"
    # a run logged before time/unix: its training time (eval excluded) stands in
    old = frame.drop(columns=["time/unix"])
    assert list(metrics.x_values(old, run, "relative time")) == [0.0, 8.0, 16.0, 24.0]
    missing = metrics.metrics_figure({"#1": frame}, metrics.MetricView(("loss/kl",), 0.0, False, "step"))
    assert not missing.data and "not logged: loss/kl" in missing.layout.annotations[0].text
    assert metrics.metric_keys([frame]) == ["grad/norm", "loss/clipfrac", "time/step"]


def test_log_scale_notes_a_metric_with_no_positive_values_in_its_plot_and_axes_keep_their_type():
    frame = pd.DataFrame(
        {
            "step": [1, 2, 3],
            "loss/kl": [0.0, 0.0, 0.0],  # an all-zero metric (beta = 0)
            "grad/norm": [4.0, 1.0, 2.0],
            "time/unix": [110.0, 120.0, 135.0],
            "time/step": [8.0, 8.0, 8.0],  # the training time axis
        }
    )
    run = {"started_at": 95.0}
    note = "loss/kl: no positive values for a log axis; untick log scale"

    def notes(fig) -> list[tuple[str, str]]:  # (text, the plot it sits in) of each log-scale note
        return [(a.text, a.yref) for a in fig.layout.annotations if a.name == metrics.LOG_NOTE]

    for x in metrics.X_AXES:
        alone = metrics.metrics_figure(
            {"#1": frame}, metrics.MetricView(("loss/kl",), 0.0, True, x), runs={"#1": run}
        )
        # its plot, empty, says why; its trace keeps the series the page redraws it from when log is unticked
        assert [t.name for t in alone.data] == ["#1 · loss/kl"] and list(alone.data[0].y) == []
        assert notes(alone) == [(note, "y domain")]
        attached = client.attach(alone, {"#1": frame}, {"#1": run})
        assert attached.data[0].meta[client.META_KEY]["y"] == [0.0, 0.0, 0.0]
        both = metrics.metrics_figure(
            {"#1": frame}, metrics.MetricView(("loss/kl", "grad/norm"), 0.0, True, x), runs={"#1": run}
        )
        assert [t.name for t in both.data] == ["#1 · loss/kl", "#1 · grad/norm"]
        assert notes(both) == [(note, "y domain")]  # in loss/kl's plot (the first), not grad/norm's
        assert list(both.data[1].y) == [4.0, 1.0, 2.0] and both.layout.title.text == "Metrics"
        assert both.layout.xaxis.type == ("date" if x == "wall time" else "linear")  # never −1…6 numbers
        linear = metrics.metrics_figure(
            {"#1": frame}, metrics.MetricView(("loss/kl",), 0.0, False, x), runs={"#1": run}
        )
        assert list(linear.data[0].y) == [0.0, 0.0, 0.0] and notes(linear) == []
        assert linear.layout.xaxis.type == ("date" if x == "wall time" else "linear")
        reward = data.reward_figure({"#1": frame.assign(**{"reward/mean": 0.0})}, x=x, runs={"#1": run})
        assert reward.layout.xaxis.type == ("date" if x == "wall time" else "linear")


def test_time_to_reach_counts_training_seconds_to_the_first_eval_at_the_level():
    exact = pd.DataFrame({"step": [0, 1, 2, 3, 4], "time/step": [np.nan, 10.0, 10.0, 10.0, 10.0],
                          "eval/reward/mean": [0.1, np.nan, 0.5, np.nan, 0.8]})  # fmt: skip
    jagg = pd.DataFrame({"step": [0, 1, 2, 3, 4], "time/step": [np.nan, 6.0, 6.0, 6.0, 6.0],
                         "eval/reward/mean": [0.1, np.nan, 0.9, np.nan, 1.0]})  # fmt: skip
    frames = {"#1 exact": exact, "#2 jagg": jagg}
    level, whose = metrics.default_level(frames, {"#1 exact": "exact", "#2 jagg": "jagg"})
    # the lower of the finals: a level both runs reach
    assert (level, whose) == (0.8, "the lower of the final evals, #1 exact's")
    table = metrics.reach_frame(frames, level).set_index("run")
    assert (
        table.at["#1 exact", "reaches at step"] == 4
        and table.at["#1 exact", "training time to reach (s)"] == 40
    )
    assert (
        table.at["#2 jagg", "reaches at step"] == 2
        and table.at["#2 jagg", "training time to reach (s)"] == 12
    )
    assert table.at["#2 jagg", "of its training time"] == "50 %" and table.at["#2 jagg", "final eval"] == 1.0
    never = metrics.reach_frame(frames, 0.95).set_index("run")
    # a run that never gets there says so, with the best it did get: never a blank cell
    assert never.at["#1 exact", "reaches at step"] == "not reached (best 0.8 at step 4 / 40.0 s)"
    assert never.at["#1 exact", "training time to reach (s)"] == "not reached"
    assert never.at["#2 jagg", "reaches at step"] == 4 and not never.isna().any().any()
    assert metrics.not_reached(exact.drop(columns=["eval/reward/mean"])) == "not reached (no eval logged)"


def test_the_default_level_is_one_no_run_has_at_its_first_eval_or_none_said_so():
    """A run that ends below where both started (0.25 < 0.3) makes no default level: both would "reach" it at
    step 0 (0 s, 0 %). The level is the lowest final eval above every run's first eval; none such is said."""

    def run(evals: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {"step": [0, 2, 4], "time/train_elapsed": [0.0, 20.0, 40.0], "eval/reward/mean": evals}
        )

    worse, better = run([0.3, 0.28, 0.25]), run([0.3, 0.5, 0.6])
    frames = {"#1 exact": worse, "#2 jagg": better}
    assert metrics.default_level(frames) == (
        0.6,
        "the lowest final eval above the runs' first evals, #2 jagg's",
    )
    table = metrics.reach_frame(frames, 0.6).set_index("run")
    assert table.at["#2 jagg", "reaches at step"] == 4 and table.at[
        "#1 exact", "training time to reach (s)"
    ] == ("not reached")
    assert metrics.no_default_level(frames) == ""
    # the higher start counts: a jagg run that starts at 0.4 and ends at 0.35 leaves only the exact run's 0.6
    assert metrics.default_level({"#1 exact": better, "#2 jagg": run([0.4, 0.5, 0.35])})[0] == 0.6
    flat = {"#1 exact": worse, "#2 jagg": run([0.3, 0.32, 0.29])}
    assert metrics.default_level(flat) is None
    assert metrics.no_default_level(flat) == (
        "No reward level by default: no final eval is above #1 exact's first eval (0.3), a level it has from "
        "its start; type a level."
    )
    assert metrics.default_level({"#1 exact": better}) == (0.6, "#1 exact's final eval")
    assert metrics.default_level({"#1 exact": worse}) is None  # one run that got worse: no level either


def test_step_axes_tick_whole_steps_memory_starts_at_zero_and_the_probe_is_its_own_phase():
    frame = pd.DataFrame({"step": [1, 2, 3], "memory/rss_bytes": [2**30, 2**30, 2**30],
                          "time/sampling": [1.0] * 3, "time/reward": [0.1] * 3, "time/probe": [0.0, 30.0, 0.0]})  # fmt: skip
    memory = panels.memory_figure(frame)
    assert memory.layout.yaxis.rangemode == "tozero" and memory.layout.xaxis.dtick == 1
    times = data.time_breakdown_figure(frame)
    probe = next(t for t in times.data if t.name == "probe")
    assert list(probe.y) == [0.0, 30.0, 0.0] and next(t for t in times.data if t.name == "reward").y[1] == 0.1
    assert times.layout.xaxis.dtick == 1


# ---------------------------------------------------------------------------------------------- an app over runs


@pytest.fixture
def studio(tmp_path):
    """An app over runs #1–#11: #1 a 6-step jagg run, #2 a 4-step exact run (eval images at 0, 2, 4 and 6),
    #3–#11 short runs; and the shipped showcase left out (showcase_dir=None) unless a test adds it."""
    root = tmp_path / "runs"
    with open_store(root) as store:
        ids = [
            _run(store, root, "six", 6, "jagg", evals=(0, 2, 4, 6)),
            _run(store, root, "four", 4, "exact", evals=(0, 2, 4)),
        ]
        ids += [_run(store, root, f"r{n}", 1) for n in range(3, 12)]
        assert ids == list(range(1, 12))
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        yield demo, root
    finally:
        demo.jagg_manager.shutdown()


def test_a_picker_takes_an_exact_id_or_label_never_a_substring(studio):
    demo, _ = studio
    runs = demo.jagg_manager.store.list_runs()
    assert (
        form.match_run("1", runs) == 1
        and form.match_run("#11", runs) == 11
        and form.match_run(" 2 ", runs) == 2
    )
    assert form.match_run(data.run_label(runs[-1]), runs) == runs[-1]["id"]  # the whole label
    assert form.match_run("#4 r4", runs) == 4  # the label without its status (it changes while a run trains)
    assert form.match_run("", runs) is None
    with pytest.raises(ConfigError, match=r"^run id: must be a whole number from 1 to \d+, got 'r1'$"):
        form.match_run("r1", runs)  # "r1" is in "r10" and "r11": not a name, so no run
    assert form.match_run("12", runs) == 12  # an id: whether run #12 exists is the handler's to say
    assert form.match_run("r4", runs) == 4 and form.match_run(" six ", runs) == 1  # a unique run name
    twins = [*runs, {**runs[-1], "id": 40}]
    with pytest.raises(
        ConfigError, match=r"^run id: 2 runs are named 'six' \(#1, #40\); pick one by its number$"
    ):
        form.match_run("six", twins)
    assert _handler(demo, "live_view")("12", 1.8)[0] == "No run #12."
    progress = _handler(demo, "live_view")("1", 1.8)[0]
    assert progress.startswith("**Run #1 six**")
    assert _handler(demo, "live_view")("r1", 1.8)[0].startswith("**Error:** run id: must be a whole number")


def test_cancel_resume_and_delete_ask_first_naming_the_run(studio):
    demo, _ = studio
    store = demo.jagg_manager.store
    queued = store.create_run("waiting", {**TrainConfig().to_dict(), "steps": 2}, None)
    handlers = demo.jagg_handlers
    question, row, pending = handlers.confirm.ask("cancel", queued)
    assert question.startswith(f"**Cancel run #{queued} waiting (queued)?**") and row["visible"] is True
    assert store.get_run(queued)["status"] == "queued"  # asking changes nothing
    assert handlers.confirm.keep()[0] == "Nothing done." and store.get_run(queued)["status"] == "queued"
    answer, row, left = handlers.live.confirmed(pending)
    assert store.get_run(queued)["status"] == "cancelled" and row["visible"] is False and left is None, answer
    question, _, pending = handlers.confirm.ask("delete", 3, True)
    assert question.startswith("**Delete run #3 r3 (finished) and its folder?**")
    message, _, _, table = handlers.history.confirmed(pending)
    assert message == "Run #3 deleted with its folder." and 3 not in set(table["id"])
    assert handlers.confirm.ask("resume", 99)[0] == "**Error:** run id: no run #99"


def test_cancel_asks_in_the_page_at_once_and_its_answer_goes_off_the_queue(studio):
    """Live's Cancel run: the question is the page's own (a ``js=`` that asks the browser's confirm before any
    server call, naming the run as the picker shows it), and the answer is one event off the queue (no wait
    behind the timer's refreshes); kept, nothing is done; confirmed, the stop is asked; refusals in one line."""
    from app import client

    demo, _ = studio
    store = demo.jagg_manager.store
    button = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "live-cancel")
    events = [f for f in demo.fns.values() if (button._id, "click") in [(t[0], t[1]) for t in f.targets]]
    assert len(events) == 1, [f.name for f in events]  # no server question first
    event = events[0]
    assert event.js == client.CANCEL_JS and "window.confirm(" in event.js and event.queue is False
    assert "#live-run input" in event.js  # the run as the picker shows it: number, name, status
    answer = event.fn
    queued = store.create_run("waiting", {**TrainConfig().to_dict(), "steps": 2}, None)
    message, row, pending, question = answer(queued, False)
    assert (message, row["visible"], pending, question) == ("Nothing done.", False, None, "")
    assert store.get_run(queued)["status"] == "queued"
    assert answer(queued, True)[0] == f"run {queued} cancelled (it had not started)"
    assert store.get_run(queued)["status"] == "cancelled"
    assert answer(3, True)[0] == "**Refused.** run 3: is already finished"
    assert answer(None, False)[0] == "**Error:** No run selected."
    assert answer(99, True)[0] == "**Error:** run id: no run #99"


def test_compare_shows_only_the_picked_runs_each_at_its_own_last_eval(studio):
    demo, _ = studio
    compare = _handler(demo, "compare_runs")
    message, showcase, reward, metric_plot, reach, summary, diff, gallery, picker = compare([1, 2, 99], 1.8)
    assert message.startswith("**Not shown:** runs: no run #99 ") and "\n" not in message  # one line
    assert showcase["visible"] is False
    assert {t.name.split(" · ")[0] for t in reward["value"].data} == {"#1 jagg", "#2 exact"}
    assert [t.name for t in metric_plot["value"].data if "(raw)" not in t.name] == [
        "#1 jagg · loss/clipfrac", "#1 jagg · grad/norm", "#2 exact · loss/clipfrac", "#2 exact · grad/norm",
    ]  # fmt: skip
    assert len(summary) == 2 and "grad/norm" in picker["choices"]
    # each run at its own first and last eval: the 6-step run's step 6 beside the 4-step run's step 4
    steps = [caption.split(" · ")[1] for _, caption in gallery["value"][:4]]
    assert steps == ["step 0", "step 0", "step 6", "step 4"] and gallery["columns"] == 4
    # time to reach the lower final eval (the exact run's 0.2 × 4 = 0.8): the jagg run (0.3 × step) at step 4
    assert "Time to reach eval reward 0.8 (the lower of the final evals, #2 exact's)" in message
    assert reach.set_index("run").at["#1 jagg", "reaches at step"] == 4
    # images at a chosen step too, and another level
    *_, gallery, _ = compare([1, 2], 1.8, "step", ["grad/norm"], 0.0, False, "1.2", "2")
    # the extra step sorts in step order: between each run's first and last eval
    assert [c.split(" · ")[1] for _, c in gallery["value"][:6]] == [
        "step 0", "step 0", "step 2", "step 2", "step 6", "step 4",
    ]  # fmt: skip
    message, *_ = compare([1, 2], 1.8, "step", ["grad/norm"], 0.0, False, "lots")
    assert message == "**Error:** reward level: must be a number or empty, got 'lots'"


def test_compare_shows_the_showcase_box_only_for_the_showcase_runs(tmp_path):
    root = tmp_path / "runs"
    demo = ui.build_app(root, background_ticks=False)  # with the shipped showcase: runs #1 and #2
    try:
        with open_store(root) as store:
            a, b = _run(store, root, "a", 2, evals=(0, 2)), _run(store, root, "b", 2, evals=(0, 2))
        compare = _handler(demo, "compare_runs")
        assert compare(demo.jagg_showcase_ids, 1.8)[1]["visible"] is True
        assert compare([a, b], 1.8)[1]["visible"] is False
    finally:
        demo.jagg_manager.shutdown()


def test_the_window_panel_draws_the_logged_window_position(tmp_path):
    root = tmp_path / "runs"
    with open_store(root) as store:
        run_id = store.create_run("sliding", TrainConfig().to_dict(), root / "run-0001")
        for step, start in ((1, 0), (2, 0), (3, 2), (4, 4)):
            store.log_step(run_id, step, {"sampler/window_start": start, "sampler/window_end": start + 4})
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        names = [p.name for p in panels.panels()]
        figure = _handler(demo, "live_view")(run_id, 1.8)[1 + names.index("window")]
        start, end = figure.data
        assert list(start.y) == [0, 0, 2, 4] and list(end.y) == [4, 4, 6, 8] and end.fill == "tonexty"
        assert list(figure.layout.yaxis.range) == [TrainConfig().sampling_steps, 0]  # high noise on top
    finally:
        demo.jagg_manager.shutdown()


def test_the_slider_on_the_newest_step_shows_a_new_evals_images(studio):
    demo, root = studio
    store = demo.jagg_manager.store
    on_tick = _handler(demo, "on_tick")
    live = store.create_run("live", TrainConfig().to_dict(), root / "run-0012")
    store.set_status(live, "running", pid=None)
    _log_eval(store, root, live, 2, "red")
    # outputs from the end: the run list seen, its choices, the signature seen, the newest step (the page
    # moves the slider to it while the slider sits on the last step: app.client.SLIDER_JS), the slider's
    # bounds, the step note, the step gallery
    first = on_tick(live, 1.8, None, None, None, "eval")
    newest, seen, runs_seen = first[-4], first[-3], first[-1]
    assert newest == 2 and "value" not in first[-5] and "step **2**" in first[-6]
    # a train image at step 4 comes first (the slider moves to 4, the nearest eval is still step 2)...
    _png(root / "run-0012" / "samples/train/step_00004/0.png", "white")
    store.log_samples(
        live, 4, [{"kind": "train", "prompt": "c", "seed": None, "path": "samples/train/step_00004/0.png"}]
    )
    store.log_step(live, 4, {"reward/mean": 0.5})
    ticks = iter(range(100, 10_000, 10))
    demo.jagg_shared.clock = lambda: float(next(ticks))  # every call a new tick: nothing read is reused
    second = on_tick(live, 1.8, seen, runs_seen, 2, "eval")
    assert second[-4] == 4 and second[-5]["maximum"] == 4 and "value" not in second[-5]
    # skipped: the page moves the slider to 4, whose change event draws its images
    assert second[-6] == {"__type__": "update"}
    # ...then the eval at step 4: the slider's value stays 4, and the images are step 4's now
    _log_eval(store, root, live, 4, "blue")
    third = on_tick(live, 1.8, second[-3], second[-1], 4, "eval")
    assert "step **4**" in third[-6] and all(c.startswith("step 4 · ") for _, c in third[-7])
    # the user moved the slider back to step 2: the newest step is told all the same (the page, which knows
    # where its slider is now, does not follow it: app.client.SLIDER_JS), the slider's value is not sent, and
    # no images are sent
    _log_eval(store, root, live, 6, "green")
    fourth = on_tick(live, 1.8, third[-3], third[-1], 2, "eval")
    assert fourth[-4] == 6 and fourth[-5]["maximum"] == 6 and "value" not in fourth[-5]
    assert fourth[-6] == {"__type__": "update"} and fourth[-7] == {"__type__": "update"}


def test_refresh_keeps_a_slider_the_user_moved_and_moves_it_on_a_run_switch(studio):
    demo, root = studio
    store = demo.jagg_manager.store
    refresh = _handler(demo, "live_refresh")
    live = store.create_run("live", TrainConfig().to_dict(), root / "run-0013")
    other = store.create_run("other", TrainConfig().to_dict(), root / "run-0014")
    store.set_status(live, "running", pid=None)
    for step in (2, 4, 6):
        _log_eval(store, root, live, step, "red")
    _log_eval(store, root, other, 3, "blue")
    view = (1.8, ["reward/mean"], 0.6, False, "step", "eval")
    # outputs from the end: the signature drawn, the newest step, the slider, the step note, the step gallery
    first = refresh(live, *view)
    seen = first[-1]
    assert first[-3]["value"] == 6 and "step **6**" in first[-4]
    # the run shown drawn again (Refresh): the slider's value and its images stay the page's, wherever the user
    # put it (the page follows the newest step only while the slider sits on the last one, client.SLIDER_JS)
    _log_eval(store, root, live, 8, "green")
    kept = refresh(live, *view, seen)
    assert "value" not in kept[-3] and kept[-3]["maximum"] == 8 and kept[-2] == 8
    assert kept[-4] == {"__type__": "update"} and kept[-5] == {"__type__": "update"}
    # another run picked starts on that run's newest step, with its images
    switched = refresh(other, *view, kept[-1])
    assert switched[-3]["value"] == 3 and "step **3**" in switched[-4]


def test_a_live_link_shows_its_progress_line_first_and_draws_its_panels_once(studio):
    """A Live link's load answers with the picker and the progress line alone (the page shows them before it
    builds any plot), its next step draws the panels, and the picker's change that the load caused draws
    nothing again; a run picked afterwards is drawn, and a page that opens on another tab gets no panels."""
    from types import SimpleNamespace

    demo, root = studio
    on_load, panels, picked = (_handler(demo, n) for n in ("on_load", "on_load_panels", "run_picked"))
    link = SimpleNamespace(query_params={"tab": "live", "run": "2"})
    n_panels = len(demo.jagg_handlers.live.panels)
    # outputs: the picker, the progress line, the panels, the delta, what is drawn, the metric picker, gallery,
    # note, slider, newest step, the signature seen
    first = on_load(1.8, link)
    assert first[0]["value"] == 2 and first[1].startswith("**Run #2 four**")
    assert all(_skipped(o) for o in first[2:-1]) and len(first) == 2 + n_panels + 2 + 6
    seen = first[-1]
    drawn = panels(2, 1.8, link)
    assert drawn[0] == first[1] and not any(_skipped(o) for o in drawn[1 : 1 + n_panels])
    assert drawn[-1] == seen and "step **4**" in drawn[-4] and drawn[-3]["value"] == 4
    view = (1.8, ["reward/mean"], 0.6, False, "step", "eval")
    again = picked(2, *view, seen)
    assert len(again) == len(drawn) and all(_skipped(o) for o in again)
    # another run picked is drawn whole, like Refresh draws it
    other = picked(1, *view, seen)
    assert other[0].startswith("**Run #1 six**") and not _skipped(other[1]) and other[-1] != seen
    # the first screen and a Compare link: the picker alone, no panels
    for query in ({}, {"tab": "compare", "runs": "1,2"}):
        page = SimpleNamespace(query_params=query)
        assert all(_skipped(o) for o in on_load(1.8, page)[1:])
        assert all(_skipped(o) for o in panels(2, 1.8, page))


# ---------------------------------------------------------------------------------------------- pairs and failures


def test_a_pair_is_validated_as_a_pair_before_either_run_is_queued(studio):
    demo, _ = studio
    before = len(demo.jagg_manager.store.list_runs())
    values = {**dict(zip(form.FORM_FIELDS, [None] * len(form.FORM_FIELDS)))}
    values.update(name="p", backbone="tiny-shapes", model_path="", rewards="shapes-dense: 1", algorithm="flow-grpo",
                  window=4, jagg_frac=1.0, cv_frac=0.0, jagg_until_step=0, strategy="jagg", steps=2, group_size=4, lr=1e-4, seed=0, processes=1,
                  overrides="probe_every=2", picks_timeout_s=form.PICKS_TIMEOUT_DEFAULT)  # fmt: skip
    message, run_id, _ = _handler(demo, "compare_exact_jagg")(*values.values(), None)  # no request
    assert message == (
        "**Not launched.** the pair's exact run: probe_every: probes compare JAGG with exact; needs strategy "
        "jagg or endpoint"
    )
    assert run_id is None and len(demo.jagg_manager.store.list_runs()) == before
    with pytest.raises(ConfigError, match="^the pair's exact run: probe_every"):
        form.pair_configs(TrainConfig().apply_overrides(["probe_every=2"]))


def test_the_overrides_example_works_as_typed(tmp_path):
    cfg = form.form_config(tmp_path, "x", "tiny-shapes", "", "shapes-dense: 1", "flow-grpo", 4, 1.0, 0.0, 0, "jagg",
                           2, 4, 1e-4, 0, 1, form.OVERRIDES_EXAMPLE)  # fmt: skip
    assert cfg.sampling_steps == 8 and cfg.eval_every == 5


def test_the_reports_runs_table_shows_the_paired_run_as_an_integer(tmp_path):
    root = tmp_path / "runs"
    with open_store(root) as store:
        a, b = _run(store, root, "a", 1), _run(store, root, "b", 1)
        store.set_paired(b, a)
        page = _runs_section(store, [a, b])
    heads = re.findall(r"<th>([^<]*)</th>", page)
    rows = [re.findall(r"<td>([^<]*)</td>", row) for row in page.split("<tbody>", 1)[1].split("</tr>")[:-1]]
    assert [row[heads.index("paired")] for row in rows] == ["–", str(a)]  # not "1.0"


def test_a_queued_run_that_cannot_start_records_its_reason(tmp_path):
    root = tmp_path / "runs"
    with open_store(root) as store:
        bad = {**TrainConfig().to_dict(), "strategy": "exact", "probe_every": 2, "output_dir": str(root)}
        run_id = store.create_run("bad", bad, root / "run-0001")
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", "train", "--run-id", str(run_id), "--runs-dir", str(root)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    with open_store(root) as store:
        run = store.get_run(run_id)
    assert run["status"] == "failed"
    assert run["error"] == "probe_every: probes compare JAGG with exact; needs strategy jagg or endpoint"


def test_history_refreshes_when_a_run_moves_and_a_row_click_picks_its_run(studio):
    import gradio as gr

    demo, root = studio
    history = demo.jagg_handlers.history
    table, seen = history.history_tick(None, "", "all", "all", "all")
    assert len(table) == 11 and table["duration"].str.contains(r"\d+ (?:s|min|h)").all()
    assert history.history_tick(seen, "", "all", "all", "all")[0] == {"__type__": "update"}  # nothing moved
    ticks = iter(range(100, 10_000, 10))
    demo.jagg_shared.clock = lambda: float(next(ticks))  # a new tick each read
    store = demo.jagg_manager.store
    run_id = store.create_run("new", TrainConfig().to_dict(), None)
    table, _ = history.history_tick(seen, "", "all", "all", "all")
    assert run_id in set(table["id"])  # a new run shows without pressing Refresh
    assert list(history.history("six", "all", "all", "all")["id"]) == [1]
    assert list(history.history("", "finished", "all", "exact")["id"]) == [2]
    message, _ = history.save_note(2, "the exact baseline")
    assert message == "Note of run #2 saved."
    row = list(table["id"]).index(2)
    picked = history.pick_row(table, gr.SelectData(None, {"index": [row, 3], "value": "x", "selected": True}))
    assert picked == (2, "the exact baseline")
    # the note box follows the run id, typed or picked: another run's note (or none) replaces it
    assert history.load_note("2") == "the exact baseline" and history.load_note("3") == ""
    assert history.load_note("") == "" and history.load_note("1.5") == ""


def test_actions_that_would_be_refused_are_refused_before_the_question(studio):
    from types import SimpleNamespace

    demo, root = studio
    handlers, store = demo.jagg_handlers, demo.jagg_manager.store
    for action, why in (
        ("resume", "run 3: is finished; only a failed or cancelled run resumes"),
        ("cancel", "run 3: is already finished"),
    ):
        question, row, pending = handlers.confirm.asker(action)("3")
        assert (question, row["visible"], pending) == (f"**Refused.** {why}", False, None)
    running = store.create_run("going", TrainConfig().to_dict(), None)
    store.set_status(running, "running", pid=None)
    assert handlers.confirm.asker("delete")(str(running), True)[0] == (
        f"**Refused.** run {running}: is running; cancel it first"
    )
    assert handlers.confirm.asker("delete")("3", True)[0].startswith("**Delete run #3 r3 (finished) and its")
    # the read-only showcase and, in Space mode, another visitor's run: refused at once, no question
    handlers.guard.read_only = {3}
    assert "shipped showcase, which is read-only" in handlers.confirm.asker("delete")("3", False)[0]
    handlers.guard.read_only = set()
    handlers.guard.is_owner = lambda session: False  # as a Space visitor who did not start run #4
    visitor = SimpleNamespace(session_hash="someone-else", headers={})
    question, row, _ = handlers.confirm.asker("delete")("4", False, request=visitor)
    assert (
        question.startswith("**Refused.** delete: run 4 was not started in this session")
        and not row["visible"]
    )


def test_duplicate_clears_the_last_launch_message_and_a_pair_opens_live_on_its_jagg_run(studio):
    demo, _ = studio
    handlers = demo.jagg_handlers
    *_, tab, note, launch_message = handlers.new.duplicate("1")
    assert (
        tab["selected"] == "new"
        and note.startswith("New run form filled with run #1")
        and launch_message == ""
    )
    assert handlers.new.duplicate("99")[-2] == "**Error:** run id: no run #99"
    handlers.queue_tick = lambda: []  # queued, never started: nothing trains in this test
    values = form.config_form_values({**TrainConfig().to_dict(), "steps": 2})
    _, jagg_id, picker = handlers.new.launch_pair(*values)
    jagg = demo.jagg_manager.store.get_run(jagg_id)
    assert jagg["config"]["strategy"] == "jagg" and picker["value"] == jagg_id  # Live opens on the JAGG run
    assert data.paired_exact_run(demo.jagg_manager.store, jagg) is not None


def test_the_space_header_and_reward_hint_tell_the_truth(tmp_path):
    from app.space import SPACE_REWARDS

    demo = ui.build_app(tmp_path / "runs", space_mode=True, background_ticks=False, showcase_dir=None)
    try:
        props = [c["props"] for c in demo.config["components"]]
        header = next(p["value"] for p in props if "JAGG Studio" in str(p.get("value", "")))
        assert "reloading the page loses control of them" in header
        hint = next(p["info"] for p in props if p.get("label") == "rewards (name: weight, …)")
        assert hint == ", ".join(SPACE_REWARDS) and "pickscore" not in hint
    finally:
        demo.jagg_manager.shutdown()


def test_plots_follow_the_page_theme_light_or_dark(studio):
    from app import layout

    demo, _ = studio  # building the app made the page's template the default
    fig = data.reward_figure({"#1": demo.jagg_manager.store.metrics_frame(1)})
    template = fig.layout.template.layout
    assert (template.paper_bgcolor, template.plot_bgcolor) == ("rgba(0,0,0,0)", "rgba(0,0,0,0)")
    assert fig.layout.template.layout.xaxis.gridcolor == "rgba(128,128,128,0.25)"
    assert ".dark .js-plotly-plot .main-svg text" in layout.CSS and "var(--body-text-color)" in layout.CSS
