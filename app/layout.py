"""The app's layout: one function per tab, each building its components inside the open gr.Blocks and
returning them by name. No handler runs here and nothing is built at import time; :mod:`app.ui` wires the
components to :mod:`app.handlers`.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app import data, metrics, panels, samples, showcase
from app.form import NO_SWITCH, NO_TIMEOUT, OVERRIDES_EXAMPLE, PICKS_TIMEOUT_DEFAULT
from app.space import CAPS, OWNER_PASSWORD_ENV, SPACE_REWARDS, SpaceLimits
from jagg_engine.train.config import ALGORITHMS, STRATEGIES, TrainConfig

# The rewards the New run form offers outside a Space (a Space offers only its weight-free ones).
ALL_REWARDS_HINT = (*SPACE_REWARDS, "pickscore", "clipscore", "hpsv2")

# Page-wide style (passed to launch): low-resolution samples drawn pixel for pixel, never smoothed, a
# caption shown whole while the pointer is on its image, and in dark mode the plots' titles, ticks and
# legends in the theme's text colour (their backgrounds are transparent: app.metrics.use_page_theme).
CSS = """
#compare-gallery .caption-label, #step-gallery .caption-label, #live-gallery .caption-label {
  white-space: normal; overflow: visible; text-overflow: clip; max-width: none; }
#compare-gallery img, #step-gallery img, #live-gallery img, #tryit-base img, #tryit-trained img {
  image-rendering: pixelated; }
.thumbnail-item:hover .caption-label { white-space: normal; overflow: visible; text-overflow: clip;
  max-width: none; z-index: 20; }
.dark .js-plotly-plot .main-svg text:not(.nums):not(.name) { fill: var(--body-text-color) !important; }
"""

# Run pickers: Enter takes the run whose id or whole label is what was typed, never the first label that
# merely contains it (with runs #1-#11, "1" is #1, not #11). Without such a run, Enter picks nothing
# from the list: the typed text goes to the app, which resolves an id exactly or says in one line that no
# run has that name (app.form.match_run).
HEAD = """<script>
(() => {
  const exact = (typed, label) => {
    const t = typed.trim(), m = t.match(/^#?(\\d+)$/);
    if (m) return label.startsWith("#" + m[1] + " ");
    return label === t || label.replace(/ \\([^()]*\\)$/, "") === t;
  };
  window.addEventListener("keydown", (event) => {
    const input = event.target;
    const picker = event.key === "Enter" && input.closest ? input.closest(".run-picker") : null;
    const typed = picker ? input.value || "" : "";
    if (!typed.trim()) return;
    const options = [...picker.querySelectorAll("ul.option-list li[data-index]")];
    if (!options.length && picker.classList.contains("run-picker-multi")) return;  // an unknown id: a chip

    event.preventDefault();
    event.stopImmediatePropagation();
    const hit = options.find((li) => exact(typed, li.textContent.replace(/^\\s*\u2713/, "").trim()));
    if (hit) hit.dispatchEvent(new MouseEvent("mousedown", { bubbles: true, cancelable: true }));
    // the list closes; without a hit the app gets the text as typed and resolves an id exactly
    if (!picker.classList.contains("run-picker-multi")) input.blur();
  }, true);
})();
</script>"""


# The page's event streams end when the page is left. Chromium keeps a page it may restore with Back (the
# back/forward cache) with its open requests: gradio's heartbeat stream (and a queue/data stream while
# events are pending) of every page left in the last minute or so hold sockets, and a browser opens at most
# six to one host. Six or seven links opened in a row then left the next page at "Loading..." for 10-50 s,
# waiting for a socket (measured: docs/app.md). So every event-stream request of the page also ends when
# the page is hidden, and a page restored from that cache reloads (its streams are gone).
STREAMS = """<script>
(() => {
  if (typeof AbortSignal.any !== "function") return;  // a browser without it keeps gradio's own streams
  const left = new AbortController();
  const fetch0 = window.fetch;
  window.fetch = function (input, init) {
    if (input instanceof Request && init === undefined
        && (input.headers.get("Accept") || "").includes("text/event-stream")) {
      return fetch0.call(this, new Request(input, {signal: AbortSignal.any([input.signal, left.signal])}));
    }
    return fetch0.apply(this, arguments);
  };
  window.addEventListener("pagehide", () => left.abort());
  window.addEventListener("pageshow", (event) => { if (event.persisted) location.reload(); });
})();
</script>"""


def _any_step(slider: gr.Slider, payload: float | None) -> float | None:
    """Live's step slider's preprocess: its value as it comes, without checking it against the bounds the
    server holds for the session. The page moves the slider to the newest step within the bounds it shows
    (:data:`app.client.SLIDER_JS`), and the server's copy of those bounds can lag the page's (a page load beside
    a live run: "step: must be a number from 0 to 1, got 196" as an error toast); the step picks the nearest
    logged images either way (:meth:`app.handlers.LiveHandlers.step_images`). (A subclass of gr.Slider would
    make gradio write a .pyi stub beside this file at each import.)"""
    return None if payload is None else gr.Number.round_to_precision(payload, slider.precision)


def confirm_row(prefix: str) -> SimpleNamespace:
    """A hidden question with Confirm and Keep buttons, and the action it waits for (gr.State)."""
    question = gr.Markdown(elem_id=f"{prefix}-confirm-question")
    with gr.Row(visible=False) as row:
        yes = gr.Button("Confirm", variant="stop", elem_id=f"{prefix}-confirm", scale=1)
        no = gr.Button("Keep", elem_id=f"{prefix}-keep", scale=1)
    return SimpleNamespace(question=question, row=row, yes=yes, no=no, pending=gr.State(None))


# The showcase opens on each run's training seconds (evals excluded): the time JAGG saves shows first, on the
# clock of the sentence above the curves (showcase.headline).
SHOWCASE_X = showcase.SHOWCASE_X


def metric_controls(
    prefix: str,
    x_only: bool = False,
    x: str = "step",
    visible: bool | str = True,
    shown: tuple[str, ...] = metrics.DEFAULT_METRICS,
) -> SimpleNamespace:
    """The metrics view's controls (trackio / wandb conventions): which logged metrics (``shown`` at first), EMA
    smoothing, log scale and the x axis (``x`` at first), in one row (``row``, shown as ``visible`` says at first).
    Their values are :class:`app.metrics.MetricView`'s fields, in its order."""
    view = metrics.MetricView(metrics=shown)
    with gr.Row(visible=visible, elem_id=f"{prefix}-view") as row:
        pick = gr.Dropdown(
            choices=list(view.metrics), value=list(view.metrics), multiselect=True, allow_custom_value=True,
            label="metrics (any logged key)", scale=4, elem_id=f"{prefix}-metric-pick",
        )  # fmt: skip
        smoothing = gr.Slider(
            0.0, 0.99, value=view.smoothing, step=0.01, label="smoothing (EMA)", scale=2,
            elem_id=f"{prefix}-smoothing",
        )  # fmt: skip
        log_y = gr.Checkbox(value=False, label="log scale", scale=1, elem_id=f"{prefix}-log-scale")
        axis = gr.Radio(list(metrics.X_AXES), value=x, label="x axis", scale=2, elem_id=f"{prefix}-x")
    return SimpleNamespace(
        pick=pick, smoothing=smoothing, log_y=log_y, x=axis, inputs=[pick, smoothing, log_y, axis], row=row
    )


def header(space: bool, limits: SpaceLimits) -> None:
    gr.Markdown(
        "# JAGG Studio\nGRPO for flow-matching image transformers, with JAGG: two endpoint backward passes "
        "per window of W denoising steps instead of W."
        + (
            f"\n\n*Space mode: tiny-shapes only, at most {CAPS['steps']} steps, one run trains at a time and "
            f"{limits.per_visitor} may wait or train per visitor. You can cancel, resume and delete the "
            "runs you started from this page: the runs belong to this page load, so reloading the page "
            f"loses control of them (they keep training, and stay visible to everyone). {limits.describe_disk()}*"
            if space
            else ""
        )
    )


def new_run_tab(backbones: Sequence[str], space: bool, r0: float, note: str) -> SimpleNamespace:
    """The New run form (``form``: its inputs in FORM_FIELDS order), r, the cost-model note and the buttons."""
    defaults = TrainConfig()
    max_steps = CAPS["steps"] if space else defaults.steps
    with gr.Row():
        name = gr.Textbox(label="name", value=defaults.name, scale=2)
        backbone = gr.Dropdown(list(backbones), value="tiny-shapes", label="backbone")
        model_path = gr.Textbox(
            label="model path (local folder or hub id; empty = the backbone's default)",
            visible=not space,
            scale=2,
        )
    with gr.Row():
        rewards = gr.Textbox(
            label="rewards (name: weight, …)",
            value=", ".join(f"{k}: {v:g}" for k, v in defaults.rewards.items()),
            info=", ".join(SPACE_REWARDS if space else ALL_REWARDS_HINT),
            scale=2,
        )
        algorithm = gr.Dropdown(list(ALGORITHMS), value=defaults.algorithm, label="algorithm")
        strategy = gr.Dropdown(list(STRATEGIES), value=defaults.strategy, label="strategy")
        picks_timeout_s = gr.Number(
            value=PICKS_TIMEOUT_DEFAULT,
            label="picks: wait for votes (s)",
            info=f"the picks reward only: then on with its model; {NO_TIMEOUT} = wait for every vote",
        )
    # The whole-number fields keep what was typed (no precision=0, which rounds 2.5 to 2 in gradio's
    # preprocess): the config refuses a fraction in one line naming the field.
    with gr.Row():
        window = gr.Number(value=defaults.window, label="W (window)")
        # The fractions are number boxes, not sliders: a slider's box clamps a typed 2 to 1 in the page (after
        # a toast) and launches that; the config refuses a value outside [0, 1] in one line naming the field.
        jagg_frac = gr.Number(value=defaults.jagg_frac, step=0.05, label="jagg_frac", info="0 to 1")
        cv_frac = gr.Number(
            value=defaults.cv_frac, step=0.05, label="cv_frac (control variate: JAGG unbiased)", info="0 to 1"
        )
        jagg_until_step = gr.Number(
            value=defaults.jagg_until_step or NO_SWITCH, label="JAGG until step (then exact; 0 = throughout)"
        )
        steps = gr.Number(value=min(defaults.steps, max_steps), label="steps")
        group_size = gr.Number(value=defaults.group_size, label="group size")
    with gr.Row():
        lr = gr.Number(value=defaults.lr, label="lr")
        seed = gr.Number(value=defaults.seed, label="seed")
        processes = gr.Number(value=1, label="processes", interactive=not space)
        r_input = gr.Number(value=r0, label="r = cost of forward+backward / forward")
    overrides = gr.Textbox(
        label="more settings (key=value, one a line)",
        placeholder=OVERRIDES_EXAMPLE,
        lines=3,
    )
    prediction = gr.Markdown(note)
    with gr.Row():
        launch_btn = gr.Button("Launch", variant="primary")
        pair_btn = gr.Button("Compare exact vs JAGG")
    launch_msg = gr.Markdown(elem_id="launch-msg")
    # Text, not gr.Number: a number box shows 0 before any run (gradio's frontend fills an empty one with 0).
    launched_id = gr.Textbox(label="launched run id", interactive=False, lines=1, max_lines=1)
    form = [name, backbone, model_path, rewards, algorithm, window, jagg_frac, cv_frac, jagg_until_step, strategy,
            steps, group_size, lr, seed, processes, overrides, picks_timeout_s]  # fmt: skip
    return SimpleNamespace(**locals())


def live_tab(
    choices: list[tuple[str, int]], value: int | None, live_panels: list[panels.Panel]
) -> SimpleNamespace:
    """The run picker and its actions, the progress line, the registry's panels at their places (``outputs``:
    the progress line, then the panels in registration order) and the step slider over the run's images."""
    with gr.Row():
        live_run = gr.Dropdown(
            choices=choices, value=value, label="run", scale=4, allow_custom_value=True,
            elem_id="live-run", elem_classes=["run-picker"],
            info="type a run's number or pick it from the list",
        )  # fmt: skip
        refresh_btn = gr.Button("Refresh", scale=1)
        cancel_btn = gr.Button("Cancel run", variant="stop", scale=1, elem_id="live-cancel")
        resume_btn = gr.Button("Resume run", scale=1, elem_id="live-resume")
        duplicate_btn = gr.Button("Duplicate", scale=1, elem_id="live-duplicate")
    confirm = confirm_row("live")  # Resume's question; Cancel's is the page's own (app.client.CANCEL_JS)
    cancel_ok = gr.Checkbox(False, visible=False)  # the page's answer to "Cancel run …?"
    action_msg = gr.Markdown(elem_id="live-action-msg")
    progress_md = gr.Markdown(elem_id="live-progress")
    view = metric_controls("live")
    shown: dict[str, Any] = {}
    for row in panels.rows(live_panels):
        with gr.Row():
            for panel in row:
                shown[panel.name] = panel.component()
    with gr.Accordion("Samples over steps: the same prompt and seed as training goes on", open=True):
        with gr.Row():
            step_kind = gr.Radio(list(samples.KINDS), value="eval", label="images", scale=1)
            step_slider = gr.Slider(0, 1, value=1, step=1, label="step", scale=4, elem_id="step-slider")
            step_slider.preprocess = types.MethodType(_any_step, step_slider)  # type: ignore[method-assign]
        # The step the slider shows, for the timer: a tick sent while the bounds of another run arrive could
        # carry a step outside the session's new bounds, which gr.Slider refuses with an error toast.
        step_at = gr.State(None)
        # The newest step, from each refresh: the page moves the slider to it while the slider sits on the last
        # step (app.client.SLIDER_JS), never after the user moved it away.
        step_latest = gr.Number(visible="hidden", elem_id="step-latest")
        # A tick's new points of the plots the page holds (app.stream), which the page appends; and the button
        # the page presses when it holds another figure than the one a delta extends (the panels sent whole).
        delta = gr.JSON(visible="hidden", elem_id="live-delta")
        resync_btn = gr.Button("redraw", visible="hidden", elem_id="live-resync")
        # The API's step (any number: the images of the logged step nearest to it are shown).
        step_asked = gr.Number(label="step", visible=False)
        step_note = gr.Markdown(elem_id="step-note")
        step_gallery = gr.Gallery(
            label="images at this step", columns=6, height="auto", elem_id="step-gallery"
        )
    outputs = [progress_md, *(shown[p.name] for p in live_panels)]
    return SimpleNamespace(**locals())


def compare_tab(
    store: Any,
    choices: list[tuple[str, int]],
    showcase_ids: Sequence[int],
    shown: tuple | None,
    headline: str = "",
) -> SimpleNamespace:
    """Run picker, a one-line message, the showcase (only while its runs are the ones picked), reward and
    metrics plots, time to reach a reward level, summary, config diff and side-by-side images; with
    ``shown`` (the showcase's comparison, :meth:`HistoryHandlers.compare`'s outputs) filled at the first
    paint. Plots stay hidden until Compare draws them: no empty box above the images."""
    with gr.Column(visible=bool(shown)) as showcase_box:
        if shown:
            gr.Markdown(
                f"**Showcase** (read-only): run #{showcase_ids[0]} is Flow-GRPO's exact backward over the "
                f"whole SDE range, run #{showcase_ids[1]} the default (the first 4 of 12 steps trained by one "
                "JAGG backward, DPM-Solver++ after them), 40 steps each of "
                "`configs/tiny-shapes-cpu.yaml`, same seed, prompts and eval seeds (seed 0 of the README's "
                f"time-to-quality race; `{showcase.RECORD_COMMAND}` records them again). Pick other runs and "
                "press Compare."
            )
            if headline:
                gr.Markdown(headline, elem_id="showcase-headline")
            # Drawn without plotly, against each run's training seconds, so that the curves and the time saved
            # are there at the first paint; Compare draws the interactive plot below (on the same time axis).
            gr.HTML(showcase.curves_over_time(store, list(showcase_ids)), elem_id="showcase-curves")
    with gr.Row():
        compare_runs = gr.Dropdown(
            choices=choices,
            value=list(showcase_ids) if shown else None,
            multiselect=True,
            label="runs (two or more)",
            allow_custom_value=True,
            scale=4,
            elem_id="compare-runs",
            elem_classes=["run-picker", "run-picker-multi"],
        )
        compare_btn = gr.Button("Compare", scale=1, elem_id="compare-btn")
        report_btn = gr.Button("Report (HTML)", scale=1)
    with gr.Row():
        level = gr.Textbox(
            label="reward level (empty: the lowest final eval above the runs' first evals)",
            value="",
            elem_id="compare-level",
        )
        image_step = gr.Textbox(
            label="images also at step (empty: first and last only)", value="", elem_id="compare-step"
        )
    compare_msg = gr.Markdown(value=shown[0] if shown else "", elem_id="compare-msg")
    report_msg = gr.Markdown()
    report_file = gr.File(
        label="report: one HTML file that opens offline",
        visible=False,
        interactive=False,
        elem_id="compare-report",
    )
    # The view's controls act on Compare's plots only: out of sight (still in the page, for its script and a
    # link's values) until Compare draws them; the showcase's first-screen curves are static.
    view = metric_controls(
        "compare", x=SHOWCASE_X if shown else "step", visible="hidden", shown=metrics.COMPARE_METRICS
    )
    shown_labels = (
        [f"#{run['id']} {run['config'].get('strategy')}" for run in shown_runs_of(store, showcase_ids)]
        if shown
        else []
    )
    shown_runs = gr.CheckboxGroup(
        choices=shown_labels,
        value=shown_labels,
        label="runs shown",
        elem_id="compare-shown",
        visible="hidden",
    )
    compare_plot = gr.Plot(label="reward", elem_id="compare-plot", visible=False)
    metrics_plot = gr.Plot(label="metrics", elem_id="compare-metrics", visible=False)
    reach_table = gr.Dataframe(
        label="time to reach the reward level: training seconds (eval excluded) and step of the first eval at "
        "or above it",
        interactive=False,
        value=shown[4] if shown else None,
        elem_id="compare-reach",
    )
    compare_table = gr.Dataframe(
        label="summary: final reward and update-phase speedup (measured vs predicted)",
        interactive=False,
        value=shown[5] if shown else None,
    )
    diff_table = gr.Dataframe(label="config diff", interactive=False, value=shown[6] if shown else None)
    compare_gallery = gr.Gallery(
        label="same prompt and seed, side by side: each run at its own first eval, then at its own last",
        columns=4,
        height="auto",
        value=shown[7]["value"] if shown else None,
        elem_id="compare-gallery",
    )
    outputs = [compare_msg, showcase_box, compare_plot, metrics_plot, reach_table, compare_table, diff_table,
               compare_gallery, view.pick]  # fmt: skip
    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "frames"})


def tryit_tab(
    choices: list[tuple[str, int]], value: int | None, steps: list[int], caps: dict[str, int]
) -> SimpleNamespace:
    """Try it: a run (with a checkpoint) and its step, prompts and seeds, Generate and Cancel, a progress line
    and the base model's and the run's images side by side (:mod:`app.tryit`)."""
    with gr.Row():
        run = gr.Dropdown(
            choices=choices, value=value, label="run (runs with a checkpoint)", scale=3,
            allow_custom_value=True, elem_id="tryit-run", elem_classes=["run-picker"],
            info="a run saves a checkpoint when it ends (and every checkpoint_every steps); the showcase's JAGG run"
            " ships its aligned model, its exact run none. It opens on the finished run trained the most steps",
        )  # fmt: skip
        step = gr.Dropdown(
            choices=steps, value=steps[-1] if steps else None, label="step (a checkpoint)", scale=1,
            allow_custom_value=True, elem_id="tryit-step",
        )  # fmt: skip
    with gr.Row():
        prompts = gr.Textbox(
            label=f"prompts (one a line, at most {caps['prompts']})", lines=3, scale=3, elem_id="tryit-prompts",
            placeholder="red circle left",
        )  # fmt: skip
        seeds = gr.Textbox(
            label=f"seeds (at most {caps['seeds']})", value="0, 1", scale=1, elem_id="tryit-seeds"
        )
    with gr.Row():
        generate_btn = gr.Button("Generate", variant="primary", elem_id="tryit-generate")
        cancel_btn = gr.Button("Cancel", variant="stop", elem_id="tryit-cancel")
    message = gr.Markdown(elem_id="tryit-msg")
    with gr.Row():
        base = gr.Gallery(label="base model", height="auto", elem_id="tryit-base")
        trained = gr.Gallery(label="the run's weights", height="auto", elem_id="tryit-trained")
    return SimpleNamespace(**locals())


def shown_runs_of(store: Any, ids: Sequence[int]) -> list[dict[str, Any]]:
    """The run rows of ``ids`` that exist, in order."""
    return [run for run in (store.get_run(i) for i in ids) if run is not None]


def history_tab(space: bool, backbones: Sequence[str] = ()) -> SimpleNamespace:
    """Search and filters, the runs table (a click on a row picks its run), the actions on a run id (Delete
    and Resume ask first), its note, and (Space mode) the owner's login and downloads."""
    any_ = [data.ALL]
    with gr.Row():
        search = gr.Textbox(label="search (name, note)", scale=3, elem_id="history-search")
        status = gr.Dropdown(any_ + ["queued", "running", "finished", "failed", "cancelled"], value=data.ALL,
                             label="status", scale=1)  # fmt: skip
        backbone = gr.Dropdown(any_ + list(backbones), value=data.ALL, label="backbone", scale=1)
        strategy = gr.Dropdown(any_ + list(STRATEGIES), value=data.ALL, label="strategy", scale=1)
    filters = [search, status, backbone, strategy]
    history_table = gr.Dataframe(
        label="runs (click a row to pick it)", interactive=False, elem_id="history-table"
    )
    with gr.Row():
        history_btn = gr.Button("Refresh")
        # Text, not gr.Number (which shows 0 while empty); parsed exactly: 1.5 is refused, not run 2.
        target = gr.Textbox(
            label="run id", placeholder="e.g. 12", lines=1, max_lines=1, elem_id="history-target"
        )
        delete_files = gr.Checkbox(label="also delete its folder", value=False)
        delete_btn = gr.Button("Delete", variant="stop")
        resume_btn = gr.Button("Resume")
        duplicate_btn = gr.Button("Duplicate")
        export_btn = gr.Button("Export CSV + JSON")
        model_btn = gr.Button("Export model", elem_id="history-export-model")
    with gr.Row():
        note = gr.Textbox(label="note of this run", scale=4, elem_id="history-note")
        note_btn = gr.Button("Save note", scale=1)
    confirm = confirm_row("history")
    history_msg = gr.Markdown()
    export_files = gr.File(label="export", file_count="multiple")
    model_file = gr.File(  # shown once it holds an export (app.tryit.TryIt.export_model)
        label="model: the `jagg export-model` folder as a zip",
        visible=False,
        interactive=False,
        elem_id="history-model-file",
    )
    with gr.Accordion("Owner", open=False, visible=space):
        with gr.Row():
            password = gr.Textbox(
                label=f"owner password (Space secret {OWNER_PASSWORD_ENV})", type="password"
            )
            login_btn = gr.Button("Log in")
        login_msg = gr.Markdown()
        with gr.Row():
            owner_path = gr.Textbox(label="file of the runs folder (jagg.db, run-0001/train.log, …)")
            owner_btn = gr.Button("Download")
        owner_msg = gr.Markdown()
        owner_download = gr.File(label="owner download")
    return SimpleNamespace(**locals())
