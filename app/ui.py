"""The Gradio app: new run, live view, compare, history. ``build_app(runs_dir) -> gr.Blocks``.

Three parts: :mod:`app.layout` builds each tab's components, :mod:`app.handlers` holds the handlers (plain
methods over :class:`app.runs.RunManager` and :mod:`app.data`), and :func:`wire` here connects them. The Live
tab's panels come from the registry of :mod:`app.panels`. Nothing is built at import time. Every event has
an ``api_name`` so gradio_client (and scripts) can drive the app the same way the browser does.

Space mode (a Hugging Face Space: ``SPACE_ID`` is set) holds visitors to :mod:`app.space`'s policy: capped
runs of tiny-shapes, no paths, queue limits, only their own runs to cancel, resume or delete, an owner login.
The app opens on the Compare tab showing the shipped showcase (:mod:`app.showcase`), read-only.
"""

from __future__ import annotations

import html
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app import client, data, layout, metrics, panels, showcase, tryit, vote
from app.form import (
    FORM_FIELDS,
    form_config,
    has_gpu,
    parse_overrides,
    parse_ratio,
    parse_rewards,
    parse_run_id,
    speedup_note,
)
from app.handlers import TICK_S, Handlers
from app.runs import CommandFactory, RunManager, train_command, train_resume_command
from app.space import (
    OWNER_PASSWORD_ENV,
    SPACE_AUTHOR_ENV,
    SPACE_BACKBONES,
    SpaceGuard,
    SpaceLimits,
    oauth_from_env,
    space_mode_from_env,
)
from jagg_engine.backbones import BACKBONES
from jagg_engine.safe_yaml import brief
from jagg_engine.store import CorruptIndexError
from jagg_engine.train.config import TrainConfig

BACKBONE_CHOICES = tuple(name for name, spec in BACKBONES.items() if spec.in_app)  # the registry's app flag
__all__ = ["build_app", "form_config", "space_mode_from_env", "speedup_note"]
__all__ += [
    "FORM_FIELDS",
    "TICK_S",
    "has_gpu",
    "parse_overrides",
    "parse_ratio",
    "parse_rewards",
    "parse_run_id",
]


def build_app(
    runs_dir: str | os.PathLike[str],
    space_mode: bool | None = None,
    *,
    command: CommandFactory = train_command,
    resume_command: CommandFactory = train_resume_command,
    max_concurrent: int = 1,
    cancel_timeout: float = 60.0,
    r_default: float | None = None,
    background_ticks: bool = True,
    owner_password: str | None = None,
    limits: SpaceLimits | None = None,
    showcase_dir: str | os.PathLike[str] | None = showcase.SHOWCASE_DIR,
) -> gr.Blocks:
    """Build the Blocks of the app over ``runs_dir`` (created if missing; its jagg.db holds the history).

    On build, runs left from an earlier app process are re-attached: dead ones are marked failed and queued
    ones start. ``background_ticks`` also runs the queue every TICK_S seconds without a browser open (the
    page's timer does the same while one is). ``demo.jagg_manager`` is the RunManager,
    ``demo.jagg_runs_dir`` the resolved folder (never an allowed path of gradio's file route: images and
    exports reach it as copies in gradio's cache), ``demo.jagg_guard`` the :class:`SpaceGuard`.

    ``showcase_dir`` (None: none) is loaded into the history once and shown read-only on the Compare tab the
    page opens on. ``owner_password`` (default: the JAGG_OWNER_PASSWORD environment variable) and ``limits``
    (default: from the environment) apply in space mode.
    """
    space = space_mode_from_env() if space_mode is None else space_mode
    root = Path(runs_dir).resolve()
    try:
        manager = RunManager(
            root,
            command=command,
            max_concurrent=max_concurrent,
            cancel_timeout=cancel_timeout,
            resume_command=resume_command,
        )
    except CorruptIndexError as exc:  # the app starts and says so (one line: the file and `jagg reindex`)
        return index_error_app(root, str(exc))
    manager.tick()
    showcase_ids = showcase.install(manager.store, root, showcase_dir) if showcase_dir is not None else []
    guard = SpaceGuard(
        root,
        space,
        owner_password if owner_password is not None else os.environ.get(OWNER_PASSWORD_ENV),
        limits or SpaceLimits.from_env(),
        read_only=showcase_ids,
        owner_name=os.environ.get(SPACE_AUTHOR_ENV),
    )
    r0 = r_default if r_default is not None else data.default_r(has_gpu())
    metrics.use_page_theme()  # plots on the page's own background, light or dark
    handlers = Handlers(manager, guard, root, space, r0, panels.panels(), showcase_ids)
    # gradio's cache (sample-image copies, reports, exports) is swept of files older than an hour, every 10
    # minutes; a visitor's reports and exports are also pruned as they are written (app.space.prune_exports).
    with gr.Blocks(title="JAGG Studio", delete_cache=DELETE_CACHE) as demo:
        page = build_layout(handlers, SPACE_BACKBONES if space else BACKBONE_CHOICES, showcase_ids)
        wire(demo, page, handlers)
        if space and oauth_from_env() and _oauth_installed():  # hf_oauth: true in README's front matter
            with page.history_tab:
                gr.LoginButton(value="Sign in with Hugging Face (owner)")
            demo.load(handlers.history.login_oauth, None, page.history.login_msg, api_visibility="private")
    readable_api_errors(demo)

    demo.jagg_manager = manager  # type: ignore[attr-defined]
    demo.jagg_shared = handlers.shared  # type: ignore[attr-defined]
    demo.jagg_handlers = handlers  # type: ignore[attr-defined]
    demo.jagg_runs_dir = root  # type: ignore[attr-defined]
    demo.jagg_guard = guard  # type: ignore[attr-defined]
    demo.jagg_showcase_ids = list(showcase_ids)  # type: ignore[attr-defined]
    demo.jagg_css = layout.CSS  # type: ignore[attr-defined]  # for launch()
    demo.jagg_head = layout.HEAD + layout.STREAMS + client.SCRIPT + vote.KEYS_SCRIPT  # type: ignore[attr-defined]  # pickers, views, keys
    demo.jagg_stop_ticker = threading.Event()  # type: ignore[attr-defined]  # set() stops the queue ticker
    if background_ticks:
        _start_ticker(handlers.shared.tick, stop=demo.jagg_stop_ticker)
    return demo


def index_error_app(root: Path, message: str) -> gr.Blocks:
    """The page of an app whose run index cannot be opened: the one-line message, nothing else to break."""
    with gr.Blocks(title="JAGG Studio") as demo:
        gr.Markdown("# JAGG Studio")
        gr.Textbox(
            value=message, label="The run index cannot be opened", interactive=False, elem_id="index-error"
        )
    demo.jagg_manager = None  # type: ignore[attr-defined]
    demo.jagg_runs_dir = root  # type: ignore[attr-defined]
    demo.jagg_index_error = message  # type: ignore[attr-defined]
    demo.jagg_stop_ticker = threading.Event()  # type: ignore[attr-defined]
    return demo


DELETE_CACHE = (600, 3600)  # gr.Blocks(delete_cache=(every s, older than s))


def _oauth_installed() -> bool:
    """gradio's OAuth extras (``gradio[oauth]``: authlib, itsdangerous) are importable; without them a
    LoginButton would stop the app from starting, so the password login is kept alone and the log says so."""
    import importlib.util

    if all(importlib.util.find_spec(name) for name in ("authlib", "itsdangerous")):
        return True
    print(
        "jagg app: OAuth is on but gradio[oauth] is not installed; owner login by password only", flush=True
    )
    return False


def readable_api_errors(demo: gr.Blocks) -> None:
    """Make every input component refuse a value of the wrong type (from gradio_client or a hand-made API
    call) with one line naming the component, instead of gradio's bare "upstream app raised an exception":
    each component's ``preprocess`` is wrapped so that any error becomes a ``gr.Error`` (shown to the
    client) that names the component's label and what it accepts, echoing at most 80 characters."""
    for block in demo.blocks.values():
        _make_readable(block)
    # A component updated in a session (new choices, new bounds) is a new instance kept in that session's
    # state, and gradio preprocesses that copy: wrap each copy before an event's inputs are preprocessed.
    preprocess_data = demo.preprocess_data

    async def readable_preprocess_data(
        block_fn: Any, inputs: list[Any], state: Any, *args: Any, **kw: Any
    ) -> Any:
        blocks = getattr(getattr(state, "blocks_config", None), "blocks", {})
        for block in block_fn.inputs:
            _make_readable(blocks.get(block._id))
        return await preprocess_data(block_fn, inputs, state, *args, **kw)

    demo.preprocess_data = readable_preprocess_data  # type: ignore[method-assign]


def _make_readable(block: Any) -> None:
    if (
        isinstance(block, gr.components.Component)
        and not isinstance(block, gr.State)
        and not getattr(block.preprocess, "readable", False)
    ):
        block.preprocess = _readable(block, block.preprocess)


def _readable(block: Any, preprocess: Callable[[Any], Any]) -> Callable[[Any], Any]:
    label = str(getattr(block, "label", None) or getattr(block, "elem_id", None) or type(block).__name__)
    if isinstance(block, gr.Slider):
        wanted = f"a number from {block.minimum:g} to {block.maximum:g}"
    elif isinstance(block, gr.Number):
        wanted = "a number"
    elif isinstance(block, gr.Checkbox):
        wanted = "true or false"
    elif isinstance(block, (gr.Dropdown, gr.Radio)):
        names = [str(c[1] if isinstance(c, (list, tuple)) else c) for c in (block.choices or [])]
        wanted = "one of " + ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
    elif isinstance(block, gr.Textbox):
        wanted = "text"
    else:
        wanted = f"a {type(block).__name__} value"

    def call(payload: Any) -> Any:
        try:
            return preprocess(payload)
        except Exception:
            # gradio renders an error's message as HTML: the value sent (and a label) shown as typed
            message = html.escape(f"{label}: must be {wanted}, got {brief(payload)}", quote=False)
            raise gr.Error(message, print_exception=False) from None

    call.readable = True  # type: ignore[attr-defined]
    return call


def build_layout(h: Handlers, backbones: tuple[str, ...], showcase_ids: list[int]) -> SimpleNamespace:
    """Every tab's components, inside the open Blocks; the page opens on the showcase when there is one."""
    layout.header(h.space, h.guard.limits)
    shown = h.history.compare(showcase_ids, h.r0, layout.SHOWCASE_X) if len(showcase_ids) >= 2 else None
    headline = showcase.headline(h.store, showcase_ids, h.r0) if shown else ""
    defaults = TrainConfig()
    note = speedup_note(
        defaults.window, defaults.jagg_frac, defaults.strategy, h.r0, *h.reuse_defaults, defaults.cv_frac,
        defaults.jagg_until_step, defaults.steps,
    )  # fmt: skip
    with gr.Tabs(selected="compare" if shown else "new") as tabs:
        with gr.Tab("New run", id="new"):
            new = layout.new_run_tab(backbones, h.space, h.r0, note)
        with gr.Tab("Live", id="live"):
            live = layout.live_tab(h.run_choices(), h.default_run(), h.panels)
        with gr.Tab("Vote", id="vote"):
            voted = vote.Vote(h)
            vote_tab = vote.vote_tab(voted.run_choices(), voted.default_run())
        with gr.Tab("Compare", id="compare"):
            compare = layout.compare_tab(h.store, h.run_choices(), showcase_ids, shown, headline)
        with gr.Tab("Try it", id="tryit"):
            tried = tryit.TryIt(h)
            try_tab = layout.tryit_tab(*tried.initial(), tried.caps)
        with gr.Tab("History", id="history") as history_tab:
            history = layout.history_tab(h.space, backbones)
    return SimpleNamespace(
        tabs=tabs, new=new, live=live, compare=compare, history=history, history_tab=history_tab,
        run_seen=gr.State(None), list_seen=gr.State(None), tryit=try_tab, tryit_handlers=tried,
        live_drawn=gr.State(None),  # what the session's Live plots hold (app.stream)
        live_held=gr.JSON(None, visible=False),  # what the page's Live plots hold, read by the tick (client.tick_js)
        vote=vote_tab, vote_handlers=voted,
        # the runs the session's Compare plots show (None: the picker's, the first paint's)
        compare_drawn=gr.State(list(showcase_ids) if shown else None),
    )  # fmt: skip


STEP_QUEUE = "live-step"  # the Live timer and the step slider's images: answered in the order sent


def wire(demo: gr.Blocks, page: SimpleNamespace, h: Handlers) -> None:
    """Connect the components of :func:`build_layout` to the handlers, each public event by its api_name."""
    new, live, compare, history = page.new, page.live, page.compare, page.history
    launched = [new.launch_msg, new.launched_id, live.live_run]
    opens_live = (
        lambda run_id: gr.update(selected="live") if run_id else gr.skip(),
        new.launched_id,
        page.tabs,
    )
    new.launch_btn.click(
        _with_request(h.new.launch, FORM_FIELDS), new.form, launched, api_name="launch_run"
    ).then(*opens_live, api_visibility="private")
    new.pair_btn.click(
        _with_request(h.new.launch_pair, FORM_FIELDS), new.form, launched, api_name="compare_exact_jagg"
    ).then(*opens_live, api_visibility="private")
    speedup_inputs = [
        new.window,
        new.jagg_frac,
        new.strategy,
        new.r_input,
        new.cv_frac,
        new.jagg_until_step,
        new.steps,
    ]
    for component in speedup_inputs:
        component.change(h.new.predict, speedup_inputs, new.prediction, api_visibility="private")
    gr.Button(visible=False).click(h.new.predict, speedup_inputs, new.prediction, api_name="predict_speedup")

    # Live: the view's outputs are the registry's; the timer and the run picker also move the step slider
    # (and its images), and the metric picker's choices follow the run's logged keys.
    view = [live.live_run, new.r_input, *live.view.inputs]
    step_shown = [live.step_gallery, live.step_note]
    # the panels, then the new points of the plots the page holds (app.stream) and what they hold now
    streamed = [*live.outputs, live.delta, page.live_drawn]
    refreshed = [*streamed, live.view.pick, *step_shown, live.step_slider, live.step_latest]
    gr.Button(visible=False).click(h.live.live_view, view, live.outputs, api_name="live_view")
    for trigger, handler in (
        (live.live_run.change, h.live.run_picked),
        (live.refresh_btn.click, h.live.live_refresh),
    ):
        trigger(
            handler,
            [*view, live.step_kind, page.run_seen],
            [*refreshed, page.run_seen],
            api_visibility="private",
        )
    _wire_confirm(
        live.confirm, live.action_msg, h.live.confirmed, [],
        asks=[(live.resume_btn, h.confirm.asker("resume"), live.live_run)],
    )  # fmt: skip
    # Cancel asks in the page at once (the browser's own question, no server round trip) and its answer goes
    # off the queue, beside a busy timer: the stop reaches the run's row, then its trainer, within a step.
    live.cancel_btn.click(
        h.live.cancel_answered,
        [live.live_run, live.cancel_ok],
        [live.action_msg, live.confirm.row, live.confirm.pending, live.confirm.question],
        js=client.CANCEL_JS, queue=False, api_visibility="private", show_progress="hidden",
    )  # fmt: skip
    # Another run picked: the last action's message and an open question were about the run before.
    live.live_run.change(
        lambda: ("", gr.update(visible=False), None, ""), None,
        [live.action_msg, live.confirm.row, live.confirm.pending, live.confirm.question], api_visibility="private",
    )  # fmt: skip
    # The API keeps the direct actions (a script has no one to ask).
    gr.Button(visible=False).click(h.live.cancel, live.live_run, live.action_msg, api_name="cancel_run")
    gr.Button(visible=False).click(
        h.live.resume_live, live.live_run, live.action_msg, api_name="resume_live_run"
    )
    filled = [*new.form, page.tabs, live.action_msg, new.launch_msg]
    live.duplicate_btn.click(h.new.duplicate, live.live_run, filled, api_name="duplicate_run")
    gr.Button(visible=False).click(
        h.live.step_images,
        [live.live_run, live.step_kind, live.step_asked],
        step_shown,
        api_name="step_images",
    )
    steps = [live.live_run, live.step_kind, live.step_slider]
    # One queue with the timer's (STEP_QUEUE): a tick sent before the user moved the slider is answered
    # before the images of the user's step, never after them (its images would replace the user's).
    live.step_slider.change(
        h.live.step_images, steps, step_shown, api_visibility="private", concurrency_id=STEP_QUEUE
    )
    live.step_slider.change(lambda step: step, live.step_slider, live.step_at, api_visibility="private")
    live.step_kind.change(
        h.live.step_images,
        [live.live_run, live.step_kind, live.step_at],
        step_shown,
        api_visibility="private",
    )
    ticked = [live.live_run, new.r_input, page.run_seen, page.list_seen, live.step_at, live.step_kind,
              *live.view.inputs, page.live_drawn, page.live_held]  # fmt: skip
    page.live_tick = gr.Timer(TICK_S).tick(
        h.live.on_tick,
        ticked,
        [*refreshed, page.run_seen, live.live_run, page.list_seen],
        js=client.tick_js(len(ticked)),
        api_visibility="private",
        show_progress="hidden",
        concurrency_id=STEP_QUEUE,
    )
    # A run switch cancels a tick still queued or in flight for the run before: its answer never lands (the
    # panels are also hidden while the progress line names another run, client.switch_js).
    live.live_run.change(None, None, None, cancels=[page.live_tick], api_visibility="private")

    compare_inputs = [compare.compare_runs, new.r_input, compare.view.x, compare.view.pick,
                      compare.view.smoothing, compare.view.log_y, compare.level, compare.image_step]  # fmt: skip
    compare.compare_btn.click(
        h.history.compare, compare_inputs, compare.outputs, api_name="compare_runs"
    ).then(
        h.history.compare_drawn,  # the boxes, the runs drawn (compare_metrics) and the view's controls
        compare.compare_runs,
        [compare.shown_runs, page.compare_drawn, compare.view.row],
        api_visibility="private",
    )
    client.wire(demo, page, h)  # the metrics views' controls, in the page; their state in the address
    compare.report_btn.click(
        h.history.report, [compare.compare_runs, new.r_input], [compare.report_msg, compare.report_file],
        api_name="report_runs",
    ).then(  # the file box (a download link) shows once it holds a report, and hides again without one
        lambda path: gr.update(visible=bool(path)), compare.report_file, compare.report_file,
        api_visibility="private", show_progress="hidden",
    )  # fmt: skip
    compare.compare_runs.focus(
        lambda: gr.update(choices=h.run_choices()), None, compare.compare_runs, api_visibility="private"
    )

    filters = history.filters
    history.history_btn.click(h.history.history, filters, history.history_table, api_name="history")
    for control in filters:
        control.change(h.history.history, filters, history.history_table, api_visibility="private")
    history_seen = gr.State(None)
    gr.Timer(TICK_S * 2).tick(
        h.history.history_tick, [history_seen, *filters], [history.history_table, history_seen],
        api_visibility="private", show_progress="hidden",
    )  # fmt: skip
    history.history_table.select(
        h.history.pick_row, history.history_table, [history.target, history.note], api_visibility="private"
    )
    # The note box follows the run id (typed or picked): Save never writes one run's note to another.
    history.target.change(h.history.load_note, history.target, history.note, api_visibility="private")
    history.note_btn.click(
        h.history.save_note, [history.target, history.note], [history.history_msg, history.history_table],
        api_name="save_note",
    )  # fmt: skip
    _wire_confirm(
        history.confirm, history.history_msg, h.history.confirmed, [history.history_table],
        asks=[
            (history.delete_btn, h.confirm.asker("delete"), [history.target, history.delete_files]),
            (history.resume_btn, h.confirm.asker("resume"), history.target),
        ],
    )  # fmt: skip
    gr.Button(visible=False).click(
        h.history.delete, [history.target, history.delete_files], [history.history_msg, history.history_table],
        api_name="delete_run",
    )  # fmt: skip
    history.export_btn.click(
        h.history.export, history.target, [history.history_msg, history.export_files], api_name="export_run"
    )
    gr.Button(visible=False).click(
        h.history.resume, history.target, history.history_msg, api_name="resume_run"
    )
    history.duplicate_btn.click(
        h.new.duplicate,
        history.target,
        [*new.form, page.tabs, history.history_msg, new.launch_msg],
        api_visibility="private",
    )
    history.login_btn.click(h.history.login, history.password, history.login_msg, api_name="owner_login")
    history.owner_btn.click(
        h.history.owner_file,
        history.owner_path,
        [history.owner_msg, history.owner_download],
        api_name="owner_file",
    )
    tryit.wire(page.tryit, history, page.tryit_handlers)
    vote.wire(page.vote, page.vote_handlers, TICK_S)
    # The page's loads one after the other, not side by side, so that a link's view is drawn first without
    # other plots built beside it in the same process: Live's progress line, then its panels (both only for a
    # Live link: a Compare link waited on Live's panels, drawn for a tab not shown), then Compare's (a skip
    # unless the address names runs), then History's table (a tab opened later).
    demo.load(
        h.live.on_load, new.r_input, [live.live_run, *refreshed, page.run_seen], api_visibility="private",
        show_progress="hidden",
    ).then(
        h.live.on_load_panels, [live.live_run, new.r_input], [*refreshed, page.run_seen], api_visibility="private",
        show_progress="hidden",
    ).then(
        client.loader(h), new.r_input, client.load_outputs(page), api_visibility="private",
        show_progress="hidden",
    ).then(
        h.history.history, filters, history.history_table, api_visibility="private", show_progress="hidden"
    )  # fmt: skip


def _wire_confirm(
    confirm: SimpleNamespace,
    message: Any,
    confirmed: Callable[..., Any],
    more: list[Any],
    asks: Sequence[tuple[Any, Callable[..., Any], Any]] = (),
) -> None:
    """Each (button, ask, inputs) of ``asks`` puts its question up; Confirm does the pending action
    (``confirmed(pending, request)``); Keep forgets it."""
    for button, ask, inputs in asks:
        button.click(ask, inputs, [confirm.question, confirm.row, confirm.pending], api_visibility="private")

    def yes(pending: Any, request: gr.Request = None) -> Any:  # type: ignore[assignment]
        return confirmed(pending, request)

    confirm.yes.click(
        yes, confirm.pending, [message, confirm.row, confirm.pending, *more], api_visibility="private"
    ).then(lambda: "", None, confirm.question, api_visibility="private")
    confirm.no.click(
        lambda: ("Nothing done.", gr.update(visible=False), None, ""), None,
        [message, confirm.row, confirm.pending, confirm.question], api_visibility="private",
    )  # fmt: skip


def _with_request(handler: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """``handler(*inputs, request=...)`` as a function gradio passes the gr.Request to: gradio gives the
    request only to a named parameter annotated gr.Request, which a ``*form`` signature cannot have."""

    def call(*args: Any) -> Any:
        return handler(*args[:-1], request=args[-1])

    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in names]
    params.append(
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    )
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__annotations__ = {"request": gr.Request}
    return call


def _start_ticker(
    tick: Callable[[], Any], every: float = TICK_S, stop: threading.Event | None = None
) -> threading.Thread:
    """Run the queue without a browser open (a finished run's paired successor still starts) until ``stop``
    is set."""
    stop = stop or threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                tick()
            except Exception as exc:  # keep the ticker alive through a transient DB error
                print(f"jagg app: queue tick failed: {exc}", flush=True)

    thread = threading.Thread(target=loop, name="jagg-queue", daemon=True)
    thread.start()
    return thread
