"""The Live tab's panel registry, Duplicate (a run's config → the New run form), the step slider's images and
the memory / seconds-per-step panels — through the app's own handlers, without serving anything."""

from __future__ import annotations

import asyncio

import plotly.graph_objects as go
import pytest
from PIL import Image

from app import form, panels, samples, ui
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig


def _skipped(value) -> bool:
    return type(value).__name__ == "skip" or value == {"__type__": "update"}


def _handler(demo, name: str):
    return next(f.fn for f in demo.fns.values() if f.api_name == name)


def _png(path, color) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)


@pytest.fixture
def app(tmp_path):
    """An app over a runs folder holding one finished run: 3 steps of metrics, eval images of two prompts ×
    two seeds at steps 0, 2 and 3 (a colour per step), train images at step 2."""
    root = tmp_path / "runs"
    with open_store(root) as store:
        config = TrainConfig().apply_overrides(["steps=3", "eval_every=2", "lr=3e-5", "eval_seeds=[0, 5]"])
        config = {**config.to_dict(), "output_dir": str(root.resolve())}  # as the app stores it
        run_id = store.create_run("r", config, root / "run-0001")
        store.set_status(run_id, "running", pid=None)
        for step in (1, 2, 3):
            store.log_step(run_id, step, {"reward/mean": 0.1 * step, "time/step": 1.0 + step,
                                          "time/update": 0.5, "memory/rss_bytes": step * 2**30})  # fmt: skip
        for step, color in ((0, "red"), (2, "green"), (3, "blue")):
            rows = []
            for prompt in ("b square", "a circle"):
                for seed in (5, 0):
                    rel = f"samples/eval/step_{step:05d}/{prompt[0]}_seed{seed}.png"
                    _png(root / "run-0001" / rel, color)
                    rows.append({"kind": "eval", "prompt": prompt, "seed": seed, "reward": 0.1, "path": rel})
            store.log_samples(run_id, step, rows)
        _png(root / "run-0001" / "samples/train/step_00002/0.png", "white")
        store.log_samples(run_id, 2, [{"kind": "train", "prompt": "c", "seed": None, "path": "samples/train/step_00002/0.png"}])  # fmt: skip
        store.set_status(run_id, "finished")
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        yield demo, run_id
    finally:
        demo.jagg_manager.shutdown()


def test_a_panel_registered_from_a_test_file_shows_in_the_live_view(tmp_path):
    @panels.register("test-double-reward", label="twice the reward", place=(7, 0))
    def double(ctx: panels.LiveContext) -> go.Figure:
        rows = ctx.frame[["step", "reward/mean"]].dropna()
        return go.Figure(go.Scatter(x=rows["step"], y=2 * rows["reward/mean"], name="twice"))

    try:
        root = tmp_path / "runs"
        with open_store(root) as store:
            run_id = store.create_run("r", TrainConfig().to_dict(), root / "run-0001")
            for step in (1, 2):
                store.log_step(run_id, step, {"reward/mean": 0.25 * step})
        demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
        try:
            outputs = _handler(demo, "live_view")(run_id, 1.8)
            assert len(outputs) == 1 + len(panels.panels())
            figure = outputs[-1]  # registered last: the last output
            assert [t.name for t in figure.data] == ["twice"] and list(figure.data[0].y) == [0.5, 1.0]
            # on the Live tab, under its label, and refreshed by the timer like every other panel
            shown = [
                c for c in demo.config["components"] if c["props"].get("elem_id") == "live-test-double-reward"
            ]
            assert len(shown) == 1 and shown[0]["props"]["label"] == "twice the reward"
            ticked = _handler(demo, "on_tick")(run_id, 1.8, None, None)
            assert [t.name for t in ticked[len(outputs) - 1].data] == ["twice"]
            seen, runs_seen = ticked[-3], ticked[-1]
            skipped = _handler(demo, "on_tick")(run_id, 1.8, seen, runs_seen)
            assert all(_skipped(o) for o in skipped[: len(outputs) + 1])
        finally:
            demo.jagg_manager.shutdown()
    finally:
        panels.unregister("test-double-reward")
    assert "test-double-reward" not in [p.name for p in panels.panels()]


def test_the_registry_refuses_a_taken_name_or_place_and_an_unknown_kind():
    with pytest.raises(ValueError, match="'reward' is already registered"):
        panels.register("reward", label="x", place=(50, 0))(lambda ctx: None)
    with pytest.raises(ValueError, match=r"place \(1, 0\) is taken by 'reward'"):
        panels.register("other", label="x", place=(1, 0))(lambda ctx: None)
    with pytest.raises(ValueError, match="kind must be one of plot, table, gallery, text, got 'video'"):
        panels.register("other", label="x", place=(50, 0), kind="video")(lambda ctx: None)
    with pytest.raises(KeyError, match="no panel 'nope'"):
        panels.unregister("nope")
    assert "other" not in [p.name for p in panels.panels()]
    # the built-in panels keep the API's output order: gallery is the 7th output of /live_view
    assert [p.name for p in panels.panels()][:7] == [
        "reward",
        "time",
        "speedup",
        "passes",
        "probe",
        "gallery",
        "log",
    ]


def test_a_failing_panel_shows_its_error_in_its_place(app):
    demo, run_id = app

    @panels.register("test-broken", label="broken", place=(8, 0))
    def broken(ctx):
        raise RuntimeError("no such metric")

    try:
        root = demo.jagg_runs_dir
        demo2 = ui.build_app(root, background_ticks=False, showcase_dir=None)
        try:
            outputs = _handler(demo2, "live_view")(run_id, 1.8)
            assert outputs[0].startswith(f"**Run #{run_id} r**")  # the rest of the view is drawn
            assert (
                "test-broken failed: RuntimeError: no such metric" in outputs[-1].layout.annotations[0].text
            )
        finally:
            demo2.jagg_manager.shutdown()
    finally:
        panels.unregister("test-broken")


def test_memory_and_seconds_per_step_panels(app):
    demo, run_id = app
    names = [p.name for p in panels.panels()]
    outputs = _handler(demo, "live_view")(run_id, 1.8)
    memory, seconds = outputs[1 + names.index("memory")], outputs[1 + names.index("seconds")]
    assert [t.name for t in memory.data] == ["process RSS"] and list(memory.data[0].y) == [
        1.0,
        2.0,
        3.0,
    ]  # GiB
    assert [t.name for t in seconds.data] == ["training step", "update phase"]
    assert list(seconds.data[0].y) == [2.0, 3.0, 4.0]
    empty = panels.memory_figure(demo.jagg_manager.store.metrics_frame(10**6))
    assert "no memory/peak_cuda_bytes, memory/rss_bytes logged yet" in empty.layout.annotations[0].text


def test_the_step_slider_shows_one_step_of_images_in_a_fixed_prompt_and_seed_order(app):
    demo, run_id = app
    step_images = _handler(demo, "step_images")
    captions = {}
    for wanted, shown in ((0, 0), (1, 2), (2, 2), (2.6, 3), (3, 3), (40, 3)):
        items, note = step_images(run_id, "eval", wanted)
        assert f"step **{shown}** (logged at steps 0, 2, 3)" in note
        captions[wanted] = [item[1] for item in items]
        assert all(c.startswith(f"step {shown} · ") for c in captions[wanted])
        colors = {Image.open(item[0]).getpixel((0, 0)) for item in items}
        assert colors == {{0: (255, 0, 0), 2: (0, 128, 0), 3: (0, 0, 255)}[shown]}
    # the same places hold the same prompt and seed at every step
    order = [c.split(" · ", 1)[1].rsplit(" · ", 1)[0] for c in captions[0]]
    assert order == ["a circle · seed 0", "a circle · seed 5", "b square · seed 0", "b square · seed 5"]
    assert [c.split(" · ", 1)[1] for c in captions[0]] == [c.split(" · ", 1)[1] for c in captions[3]]
    items, note = step_images(run_id, "train", 3)
    assert len(items) == 1 and "Train images at step **2**" in note
    assert step_images(run_id, "video", 1)[1] == "**Error:** images: must be one of eval, train, got 'video'"
    assert step_images(None, "eval", 1) == ([], "No run selected.")
    # picking the run puts the slider on its last step with images
    refreshed = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", None) == "live_refresh")(
        run_id, 1.8
    )
    assert refreshed[-3]["maximum"] == 3 and refreshed[-3]["value"] == 3 and refreshed[-2] == 3
    assert samples.nearest_step([], 3) is None and samples.nearest_step([0, 4], None) == 4


class _LiveSession:
    """One browser session of the Live tab, driven through gradio's own ``process_api`` (its preprocessing
    and its per-session state): picking a run, and a timer tick carrying the step the page's slider shows."""

    def __init__(self, demo) -> None:
        from gradio.state_holder import SessionState

        self.demo, self.state = demo, SessionState(demo)
        fns = {f.fn.__name__: f for f in demo.fns.values() if hasattr(f.fn, "__name__")}
        self.refresh_fn, self.tick_fn = fns["live_refresh"], fns["on_tick"]

    def refresh(self, run_id) -> list:
        values = [run_id, *(b.value for b in self.refresh_fn.inputs[1:])]
        return asyncio.run(self.demo.process_api(self.refresh_fn, values, self.state))["data"]

    def tick(self, run_id, step) -> list:
        # the run, r, the run signature and run list seen (gradio reads states from the session), the step
        # the page's slider showed (a state: set in the session), then the image kind and the view controls
        # at their defaults (app/ui.py's order)
        self.state[self.tick_fn.inputs[4]._id] = step
        values = [run_id, 1.8, None, None, None, *(b.value for b in self.tick_fn.inputs[5:])]
        return asyncio.run(self.demo.process_api(self.tick_fn, values, self.state))["data"]


def test_a_tick_carrying_a_step_outside_the_slider_bounds_its_session_last_drew_is_no_error(app):
    """Through gradio's own preprocessing. A session's slider was last drawn for a run without images
    (bounds 0 to 1) while a timer tick sent from the page still carries step 3 of the run shown before:
    the tick redraws (the slider is not one of its inputs; gr.Slider would refuse 3 with a "greater than
    maximum" error toast). The API's step_images takes any step from a session that never drew the slider,
    and a value that is not a number is one line naming the step."""
    demo, run_id = app
    session = _LiveSession(demo)
    step_images = next(f for f in demo.fns.values() if f.api_name == "step_images")
    drawn = session.refresh(None)[-3]  # no run picked: the slider's bounds are 0..1
    assert (drawn["minimum"], drawn["maximum"]) == (0, 1)
    out = session.tick(run_id, 3)
    assert "step-slider" not in [getattr(b, "elem_id", None) for b in session.tick_fn.inputs]
    slider = next(o for o in out if isinstance(o, dict) and "maximum" in o)
    newest = out[[getattr(b, "elem_id", None) for b in session.tick_fn.outputs].index("step-latest")]
    # the bounds of run 3, and its newest step for the page (which moves the slider: app.client.SLIDER_JS)
    assert slider["maximum"] == 3 and "value" not in slider and newest == 3
    for api_state in (session.state, None):
        _, note = asyncio.run(demo.process_api(step_images, [run_id, "eval", 3], api_state))["data"]
        assert "Eval images at step **3** (logged at steps 0, 2, 3)" in note
    _, note = asyncio.run(demo.process_api(step_images, [run_id, "eval", "x"], session.state))["data"]
    assert note == "**Error:** step: must be a number or empty, got 'x'"


def test_the_first_tick_after_picking_a_run_leaves_the_slider_where_the_user_put_it(app):
    """Picking a run draws it (slider on its last step) and records what was drawn; the user then moves the
    slider to step 0 before the next tick: that tick, with nothing new in the run, neither redraws nor moves
    the slider back to the last step."""
    demo, run_id = app
    session = _LiveSession(demo)
    assert session.refresh(run_id)[-3]["value"] == 3
    out = session.tick(run_id, 0)  # the slider moved to step 0 (its change event keeps the step)
    slider = out[[getattr(b, "elem_id", None) for b in session.tick_fn.outputs].index("step-slider")]
    assert "value" not in slider and "maximum" not in slider, slider  # skipped: the slider stays on 0


def test_duplicate_fills_the_form_so_that_it_rebuilds_the_same_config(app, tmp_path):
    demo, run_id = app
    stored = demo.jagg_manager.store.get_run(run_id)["config"]
    *values, tabs, note, launch_message = _handler(demo, "duplicate_run")(run_id)
    assert tabs["selected"] == "new" and f"run #{run_id}'s config" in note and launch_message == ""
    filled = dict(zip(form.FORM_FIELDS, values))
    assert (filled["name"], filled["steps"], filled["lr"]) == ("tiny-shapes", 3, 3e-5)
    # the fields not on the form, and only those that differ from the defaults, go to the overrides box
    assert sorted(filled["overrides"].splitlines()) == ["eval_every=2", "eval_seeds=[0, 5]"]
    rebuilt = ui.form_config(demo.jagg_runs_dir, *values).to_dict()
    assert rebuilt == stored
    changed = ui.form_config(demo.jagg_runs_dir, *{**filled, "window": 2}.values()).to_dict()
    assert {k for k in stored if stored[k] != changed[k]} == {"window"}
    # a bad id fills nothing
    outputs = _handler(demo, "duplicate_run")(10**6)
    assert outputs[-2] == "**Error:** run id: no run #1000000"
    assert all(_skipped(o) for o in (*outputs[:-2], outputs[-1]))  # the launch message too


def test_every_config_field_survives_the_form():
    """A config with every field off its default (where validation allows any value) comes back unchanged."""
    overrides = [
        "name=a run: with spaces", "seed=3", "backbone=tiny-flux", "model_path=some/hub-id", "lora_rank=4",
        "lora_alpha=0.333333333333", "lora_targets=[to_q, to_v]", "eval_seeds=[1, 2, 3]", "eta=1e-7",
        "rewards={brightness: 0.3, colorfulness: 1.7e-5}", "reward_options={brightness: {scale: 2}}",
        "sde_window_end=null", "gradient_checkpointing=true", "prompts_file=prompts.txt", "lr=1.2345678901e-6",
        "backbone_options={depth: 2}",
    ]  # fmt: skip
    config = TrainConfig().apply_overrides(overrides).to_dict()
    values = form.config_form_values(config)
    assert form.form_fields_config(*values).to_dict() == {**config, "output_dir": TrainConfig().output_dir}


def test_the_live_gallery_shows_the_first_eval_never_the_sliders_newest_images_again(app):
    demo, run_id = app
    names = [p.name for p in panels.panels()]
    gallery = _handler(demo, "live_view")(run_id, 1.8)[1 + names.index("gallery")]
    newest, _ = _handler(demo, "step_images")(run_id, "eval", None)
    assert [caption.split(" · ")[0] for _, caption in gallery] == ["step 0"] * 4  # evals at 0, 2, 3
    assert {caption.split(" · ")[0] for _, caption in newest} == {"step 3"}
    assert not {p for p, _ in gallery} & {p for p, _ in newest}  # no image twice on the tab
    store = demo.jagg_manager.store
    once = store.create_run("one-eval", store.get_run(run_id)["config"], store.runs_root / "run-0002")
    store.log_samples(once, 0, [{**s, "step": 0} for s in store.samples(run_id, "eval") if s["step"] == 0])
    assert _handler(demo, "live_view")(once, 1.8)[1 + names.index("gallery")] == []  # the slider shows it


def test_the_reward_plot_marks_a_switch_to_jagg_and_none_on_an_exact_run():
    """A jagg_from_step run (route/jagg 0, 0, 1, 1) has its dotted line at step 3 saying "JAGG from step 3";
    an exact run (route/jagg 0 throughout) has none."""
    import pandas as pd

    from jagg_engine.report.figures import reward_figure

    def frame(routes: list[float]) -> pd.DataFrame:
        return pd.DataFrame({"step": [1, 2, 3, 4], "reward/mean": [0.1, 0.2, 0.3, 0.4], "route/jagg": routes})

    fig = reward_figure({"from": frame([0.0, 0.0, 1.0, 1.0]), "exact": frame([0.0] * 4)})
    assert [(s.x0, s.line.dash) for s in fig.layout.shapes] == [(3, "dot")]
    assert [a.text for a in fig.layout.annotations] == ["from: JAGG from step 3"]


def test_live_plots_the_bias_figure_and_marks_the_switch_to_exact(tmp_path):
    """A run with jagg_until_step = 2 and probes: the bias panel draws bias/rel_live and bias/along_live on its
    probe steps, and the reward curve has a dotted line at step 3, its first exact step."""
    root = tmp_path / "runs"
    with open_store(root) as store:
        config = TrainConfig().apply_overrides(["steps=4", "jagg_until_step=2", "probe_every=2"])
        run_id = store.create_run(
            "s", {**config.to_dict(), "output_dir": str(root.resolve())}, root / "run-0001"
        )
        for step in (1, 2, 3, 4):
            row = {"reward/mean": 0.1 * step, "time/step": 1.0, "route/jagg": float(step <= 2)}
            if step in (2, 4):
                row |= {"bias/rel_live": 0.5 / step, "bias/along_live": -0.1 * step}
            store.log_step(run_id, step, row)
        plain = store.create_run(
            "p", {**TrainConfig().to_dict(), "output_dir": str(root.resolve())}, root / "run-0002"
        )
        store.log_step(plain, 1, {"reward/mean": 0.1, "time/step": 1.0, "route/jagg": 1.0})
        for done in (run_id, plain):
            store.set_status(done, "running", pid=None)
            store.set_status(done, "finished")
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        names = [p.name for p in panels.panels()]
        outputs = _handler(demo, "live_view")(run_id, 1.8)
        bias, reward = outputs[1 + names.index("bias")], outputs[1 + names.index("reward")]
        assert [list(t.x) for t in bias.data] == [[2, 4], [2, 4]]
        assert list(bias.data[0].y) == [0.25, 0.125] and list(bias.data[1].y) == [-0.2, -0.4]
        assert [(s.x0, s.line.dash) for s in reward.layout.shapes] == [(3.0, "dot")]
        assert any("exact from step 3" in a.text for a in reward.layout.annotations)
        outputs = _handler(demo, "live_view")(plain, 1.8)  # no probes, no switch: said, and nothing drawn
        bias, reward = outputs[1 + names.index("bias")], outputs[1 + names.index("reward")]
        assert "not measured" in bias.layout.annotations[0].text and not reward.layout.shapes
    finally:
        demo.jagg_manager.shutdown()


def test_live_plots_the_reward_spread_and_says_when_none_is_logged(tmp_path):
    """The spread panel draws reward/std per step; a run that logged none says so in the panel."""
    root = tmp_path / "runs"
    with open_store(root) as store:
        config = {**TrainConfig().to_dict(), "output_dir": str(root.resolve())}
        run_id = store.create_run("s", config, root / "run-0001")
        for step in (1, 2, 3):
            store.log_step(run_id, step, {"reward/mean": 0.1 * step, "reward/std": 0.4 + 0.05 * step})
        bare = store.create_run("b", config, root / "run-0002")
        store.log_step(bare, 1, {"reward/mean": 0.1})
        for done in (run_id, bare):
            store.set_status(done, "running", pid=None)
            store.set_status(done, "finished")
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        names = [p.name for p in panels.panels()]
        spread = _handler(demo, "live_view")(run_id, 1.8)[1 + names.index("spread")]
        assert [list(t.x) for t in spread.data] == [[1, 2, 3]]
        assert (
            list(spread.data[0].y) == pytest.approx([0.45, 0.5, 0.55]) and spread.data[0].name == f"#{run_id}"
        )
        spread = _handler(demo, "live_view")(bare, 1.8)[1 + names.index("spread")]
        assert not spread.data and "no reward/std logged yet" in spread.layout.annotations[0].text
    finally:
        demo.jagg_manager.shutdown()
