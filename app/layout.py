"""The app's layout: one function per tab, each building its components inside the open gr.Blocks and
returning them by name. No handler runs here and nothing is built at import time; :mod:`app.ui` wires the
components to :mod:`app.handlers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app import data, panels, samples, showcase
from app.space import CAPS, OWNER_PASSWORD_ENV
from jagg_engine.train.config import ALGORITHMS, STRATEGIES, TrainConfig


def header(space: bool, per_visitor: int) -> None:
    gr.Markdown(
        "# JAGG Studio\nGRPO for flow-matching image transformers, with JAGG: two endpoint backward passes "
        "per window of W denoising steps instead of W."
        + (
            f"\n\n*Space mode: tiny-shapes only, at most {CAPS['steps']} steps, one run trains at a time and "
            f"{per_visitor} may wait or train per visitor. You can cancel, resume and delete the "
            "runs you started.*"
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
            info="shapes, shapes-dense, brightness, colorfulness, jpeg_compressibility, "
            "jpeg_incompressibility, pickscore, clipscore, hpsv2",
            scale=2,
        )
        algorithm = gr.Dropdown(list(ALGORITHMS), value=defaults.algorithm, label="algorithm")
        strategy = gr.Dropdown(list(STRATEGIES), value=defaults.strategy, label="strategy")
    with gr.Row():
        window = gr.Number(value=defaults.window, precision=0, label="W (window)")
        jagg_frac = gr.Slider(0.0, 1.0, value=defaults.jagg_frac, step=0.05, label="jagg_frac")
        steps = gr.Number(value=min(defaults.steps, max_steps), precision=0, label="steps")
        group_size = gr.Number(value=defaults.group_size, precision=0, label="group size")
    with gr.Row():
        lr = gr.Number(value=defaults.lr, label="lr")
        seed = gr.Number(value=defaults.seed, precision=0, label="seed")
        processes = gr.Number(value=1, precision=0, label="processes", interactive=not space)
        r_input = gr.Number(value=r0, label="r = cost of forward+backward / forward")
    overrides = gr.Textbox(
        label="more settings (key=value, one a line)",
        placeholder="sampling_steps=6\nprompts_per_step=2\neval_every=5",
        lines=3,
    )
    prediction = gr.Markdown(note)
    with gr.Row():
        launch_btn = gr.Button("Launch", variant="primary")
        pair_btn = gr.Button("Compare exact vs JAGG")
    launch_msg = gr.Markdown()
    launched_id = gr.Number(label="launched run id", precision=0, interactive=False)
    form = [name, backbone, model_path, rewards, algorithm, window, jagg_frac, strategy, steps, group_size, lr,
            seed, processes, overrides]  # fmt: skip
    return SimpleNamespace(**locals())


def live_tab(
    choices: list[tuple[str, int]], value: int | None, live_panels: list[panels.Panel]
) -> SimpleNamespace:
    """The run picker and its actions, the progress line, the registry's panels at their places (``outputs``:
    the progress line, then the panels in registration order) and the step slider over the run's images."""
    with gr.Row():
        live_run = gr.Dropdown(choices=choices, value=value, label="run", scale=4, allow_custom_value=True)
        refresh_btn = gr.Button("Refresh", scale=1)
        cancel_btn = gr.Button("Cancel run", variant="stop", scale=1)
        resume_btn = gr.Button("Resume run", scale=1, elem_id="live-resume")
        duplicate_btn = gr.Button("Duplicate", scale=1, elem_id="live-duplicate")
    action_msg = gr.Markdown(elem_id="live-action-msg")
    progress_md = gr.Markdown(elem_id="live-progress")
    shown: dict[str, Any] = {}
    for row in panels.rows(live_panels):
        with gr.Row():
            for panel in row:
                shown[panel.name] = panel.component()
    with gr.Accordion("Samples over steps: the same prompt and seed as training goes on", open=True):
        with gr.Row():
            step_kind = gr.Radio(list(samples.KINDS), value="eval", label="images", scale=1)
            step_slider = gr.Slider(0, 1, value=1, step=1, label="step", scale=4, elem_id="step-slider")
        step_note = gr.Markdown(elem_id="step-note")
        step_gallery = gr.Gallery(
            label="images at this step", columns=6, height="auto", elem_id="step-gallery"
        )
    outputs = [progress_md, *(shown[p.name] for p in live_panels)]
    return SimpleNamespace(**locals())


def compare_tab(
    store: Any, choices: list[tuple[str, int]], showcase_ids: Sequence[int], shown: tuple | None
) -> SimpleNamespace:
    """Run picker, reward plot, summary, config diff and side-by-side images; with ``shown`` (the showcase's
    comparison) filled at the first paint."""
    if shown:
        gr.Markdown(
            f"**Showcase** (read-only): runs #{showcase_ids[0]} (exact) and #{showcase_ids[1]} (JAGG), "
            "recorded with `jagg train configs/tiny-shapes-cpu.yaml`, same seed, prompts and eval seeds "
            f"(`{showcase.RECORD_COMMAND}` records them again). Pick other runs and press Compare."
        )
        # Drawn without plotly, so that the curves are there at the first paint; Compare draws the
        # interactive plot below.
        frames = {
            f"#{run['id']} {run['config'].get('strategy')}": store.metrics_frame(run["id"])
            for run in (store.get_run(i) for i in showcase_ids)
        }
        gr.HTML(data.reward_svg(frames), elem_id="showcase-curves")
    with gr.Row():
        compare_runs = gr.Dropdown(
            choices=choices,
            value=list(showcase_ids) if shown else None,
            multiselect=True,
            label="runs (two or more)",
            allow_custom_value=True,
            scale=4,
        )
        compare_btn = gr.Button("Compare", scale=1)
        report_btn = gr.Button("Report (HTML)", scale=1)
    with gr.Row():
        report_msg = gr.Markdown()
        report_file = gr.File(label="report: one HTML file that opens offline", visible=True)
    # Empty until Compare: plotly's first load is what makes a page slow to show.
    compare_plot = gr.Plot(label="reward (interactive: press Compare)", elem_id="compare-plot")
    compare_table = gr.Dataframe(
        label="summary: final reward and update-phase speedup (measured vs predicted)",
        interactive=False,
        value=shown[1] if shown else None,
    )
    diff_table = gr.Dataframe(label="config diff", interactive=False, value=shown[2] if shown else None)
    compare_gallery = gr.Gallery(
        label="same prompt and seed, side by side: each run at its first eval, then at its last",
        columns=4,
        height="auto",
        value=shown[3] if shown else None,
        elem_id="compare-gallery",
    )
    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "frames"})


def history_tab(space: bool) -> SimpleNamespace:
    """The runs table, the actions on a run id, and (Space mode) the owner's login and downloads."""
    history_table = gr.Dataframe(label="runs", interactive=False)
    with gr.Row():
        history_btn = gr.Button("Refresh")
        target = gr.Number(label="run id")  # no rounding: 1.5 is refused, not run 2
        delete_files = gr.Checkbox(label="also delete its folder", value=False)
        delete_btn = gr.Button("Delete", variant="stop")
        resume_btn = gr.Button("Resume")
        duplicate_btn = gr.Button("Duplicate")
        export_btn = gr.Button("Export CSV + JSON")
    history_msg = gr.Markdown()
    export_files = gr.File(label="export", file_count="multiple")
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
