"""The app's event handlers: plain methods over a :class:`RunManager`, a :class:`SpaceGuard` and the store.

Each handler takes the components' values and returns theirs; :mod:`app.ui` wires them to the layout of
:mod:`app.layout`. Errors come back as one-line messages (``**Not launched.**``, ``**Refused.**``,
``**Error:**``), never as exceptions, so a bad value loses nothing.
"""

from __future__ import annotations

import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from app import client, data, metrics, notes, panels, samples, stream
from app.form import (
    FORM_FIELDS,
    config_form_values,
    form_config,
    form_message,
    match_run,
    pair_configs,
    parse_ratio,
    parse_run_id,
    speedup_note,
)
from app.report import report_for_app
from app.runs import RunManager
from app.space import FilePublisher, SpaceError, SpaceGuard, prune_exports, session_export_dir
from app.text import cannot_write, md_message, md_text
from jagg_engine.safe_yaml import brief
from jagg_engine.store import BUSY_TIMEOUT_S, DB_NAME, StoreError
from jagg_engine.train.config import ConfigError, TrainConfig

TICK_S = 2.0  # the Live tab's timer and the queue ticker


def session(request: gr.Request | None) -> str | None:
    """The gradio session of a call (one per page load or gradio_client), None outside a request."""
    return getattr(request, "session_hash", None) or None


def client_address(request: gr.Request | None) -> str | None:
    """The address a request came from. On a Space the app sits behind Hugging Face's proxy, which appends
    the address it saw to X-Forwarded-For: the last entry is the one a client cannot forge."""
    if request is None:
        return None
    forwarded = [part.strip() for part in (request.headers.get("x-forwarded-for") or "").split(",")]
    forwarded = [part for part in forwarded if part]
    if forwarded:
        return forwarded[-1]
    client = getattr(request, "client", None)
    return getattr(client, "host", None)


class Handlers:
    """One app's state (``space``: Space mode; ``r0``: the default cost ratio r), the queue, and its
    handlers by tab: ``new`` (:class:`NewRunHandlers`), ``live`` (:class:`LiveHandlers`) and ``history``
    (:class:`HistoryHandlers`, with Compare)."""

    def __init__(
        self,
        manager: RunManager,
        guard: SpaceGuard,
        root: Path,
        space: bool,
        r0: float,
        live_panels: list[panels.Panel],
        showcase_ids: list[int] | None = None,
    ):
        self.manager, self.store, self.guard = manager, manager.store, guard
        self.root, self.space, self.r0 = root, space, r0
        self.panels = live_panels  # the Live tab's, fixed when the app is built
        self.showcase_ids = list(showcase_ids or [])
        self.publish = FilePublisher(root)
        self.shared = data.SharedTick(self.store, self.queue_tick, max_age=TICK_S / 2)
        defaults = TrainConfig()
        self.reuse_defaults = (defaults.reuse_rollout_velocity == "auto", defaults.updates_per_rollout)
        self.new, self.live, self.history = NewRunHandlers(self), LiveHandlers(self), HistoryHandlers(self)
        self.confirm = Confirm(self)

    # ------------------------------------------------------------------ runs and the queue
    def run_choices(self) -> list[tuple[str, int]]:
        return [(data.run_label(r), r["id"]) for r in self.store.list_runs()]

    def default_run(self) -> int | None:
        runs = self.store.list_runs()
        live = [r for r in runs if r["status"] in ("running", "queued")]
        return (live[-1] if live else runs[0])["id"] if runs else None

    def waiting(self) -> list[dict[str, Any]]:
        resuming = set(self.manager.resuming())
        return [
            r for r in self.store.list_runs() if r["status"] in ("queued", "running") or r["id"] in resuming
        ]

    def queue_tick(self) -> list[int]:
        started = self.manager.tick()
        self.guard.prune(self.store)
        return started

    def resolve(self, value: Any, field: str = "run id") -> int | None:
        """The run a picker's value names (its id, ``#id`` or its exact label; :func:`app.form.match_run`), None
        when empty; ConfigError in one line for anything else."""
        if isinstance(value, str):
            return match_run(value, self.store.list_runs(), field)
        return parse_run_id(value, field)

    def run_action(self, run_id: Any, request: gr.Request | None, action: str, empty: str) -> str:
        """Cancel or resume ``run_id`` once the id resolves and Space mode allows this session the action."""
        try:
            number = self.resolve(run_id)
            if number is None:
                return empty
            self.guard.check_action(session(request), number, action)
            return getattr(self.manager, action)(number)
        except SpaceError as exc:
            return f"**Refused.** {md_message(exc)}"
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {md_message(exc)}"


CONFIRM_VERBS = {"cancel": "Cancel", "resume": "Resume", "delete": "Delete"}


class Confirm:
    """Cancel, Resume and Delete ask first: :meth:`ask` names the run (number and name) and shows the Confirm
    button, :meth:`answer` does the action only when Confirm was pressed for that same run."""

    def __init__(self, app: Handlers):
        self.app = app

    def ask(
        self, action: str, run_id: Any, *extra: Any, request: gr.Request | None = None
    ) -> tuple[str, Any, Any]:
        """(question or one-line error, the confirm row's visibility, the pending action). An action that would
        be refused anyway (:meth:`refusal`) is refused here, before any question."""
        try:
            number = self.app.resolve(run_id)
            run = self.app.store.get_run(number) if number is not None else None
            if run is None:
                raise ConfigError("No run selected." if number is None else f"run id: no run #{number}")
        except ConfigError as exc:  # it may quote what was typed in the picker
            return f"**Error:** {md_message(exc)}", gr.update(visible=False), None
        refused = self.refusal(action, run, request)
        if refused:
            return f"**Refused.** {md_message(refused)}", gr.update(visible=False), None
        # Another visitor's run name: shown as typed, never as Markdown or HTML (no image, no link).
        what = f"run #{number} {md_text(run['name'])} ({run['status']})"
        also = " and its folder" if action == "delete" and extra and extra[0] else ""
        question = f"**{CONFIRM_VERBS[action]} {what}{also}?** Press Confirm to go on, or Keep to leave it."
        return question, gr.update(visible=True), {"action": action, "run": number, "extra": list(extra)}

    def refusal(self, action: str, run: dict[str, Any], request: gr.Request | None = None) -> str:
        """Why ``action`` on ``run`` would be refused once confirmed ("" when it would go on): the read-only
        showcase or another visitor's run (:meth:`SpaceGuard.check_action`), a resume of a run that is not
        failed or cancelled, a cancel of a run that has ended, a delete of a run still queued or training."""
        number, status = int(run["id"]), run["status"]
        try:
            self.app.guard.check_action(session(request), number, action)
        except SpaceError as exc:
            return str(exc)
        if action == "resume" and status not in ("failed", "cancelled"):
            return f"run {number}: is {status}; only a failed or cancelled run resumes"
        if action == "cancel" and status not in ("queued", "running"):
            return f"run {number}: is already {status}"
        if action == "delete" and status in ("queued", "running"):
            return f"run {number}: is {status}; cancel it first"
        return ""

    def asker(self, action: str) -> Any:
        """The handler of ``action``'s button: :meth:`ask` with the caller's request (Space mode's session)."""

        def ask(run_id: Any, *extra: Any, request: gr.Request | None = None) -> tuple[str, Any, Any]:
            return self.ask(action, run_id, *(bool(x) for x in extra), request=request)

        return ask

    def keep(self) -> tuple[str, Any, None]:
        return "Nothing done.", gr.update(visible=False), None


class _Part:
    """The handlers of one tab over the app's shared :class:`Handlers` (``self.app``)."""

    def __init__(self, app: Handlers):
        self.app, self.manager, self.store, self.guard = app, app.manager, app.store, app.guard
        self.root, self.space, self.r0, self.publish = app.root, app.space, app.r0, app.publish
        self.panels = app.panels
        self.showcase_ids = app.showcase_ids


class NewRunHandlers(_Part):
    """New run: launch one run or an exact/JAGG pair, the cost-model note, Duplicate."""

    def checked_config(self, form: tuple[Any, ...], sess: str | None, new_runs: int) -> TrainConfig:
        cfg = form_config(self.root, *form, space_mode=self.space and not self.guard.is_owner(sess))
        if self.space:
            self.guard.check_queue(sess, self.app.waiting(), new_runs)
        return cfg

    def launch(self, *form: Any, request: gr.Request | None = None) -> tuple[str, int | None, Any]:
        sess = session(request)
        try:
            cfg = self.checked_config(form, sess, 1)
            run_id = self.manager.create(cfg.to_dict())
        except ConfigError as exc:  # in the form's words: the box to change
            return f"**Not launched.** {md_message(form_message(exc))}", None, gr.skip()
        except (SpaceError, StoreError) as exc:
            return f"**Not launched.** {md_message(exc)}", None, gr.skip()
        self.guard.record(sess, [run_id])
        started = self.app.queue_tick()
        where = "started" if run_id in started else "queued (starts when the current run finishes)"
        return f"Run #{run_id} {where}.", run_id, gr.update(choices=self.app.run_choices(), value=run_id)

    def launch_pair(self, *form: Any, request: gr.Request | None = None) -> tuple[str, int | None, Any]:
        sess = session(request)
        try:
            cfg = self.checked_config(form, sess, 2)
            pair_configs(cfg)  # both runs' configs, before either is queued
            exact_id, jagg_id = self.manager.create_pair(cfg.to_dict())
        except ConfigError as exc:
            return f"**Not launched.** {md_message(form_message(exc))}", None, gr.skip()
        except (SpaceError, StoreError) as exc:
            return f"**Not launched.** {md_message(exc)}", None, gr.skip()
        self.guard.record(sess, [exact_id, jagg_id])
        self.app.queue_tick()
        return (
            self.manager.pair_message(exact_id, jagg_id),  # side by side or one after the other, and why
            jagg_id,
            # Live opens on the JAGG run: its table holds the pair's measured speedup, redrawn until both end.
            gr.update(choices=self.app.run_choices(), value=jagg_id),
        )

    def predict(
        self,
        window: float,
        jagg_frac: float,
        strategy: str,
        r: float,
        cv_frac: float = 0.0,
        jagg_until_step: float | None = None,
        steps: float | None = None,
    ) -> str:
        return speedup_note(
            window, jagg_frac, strategy, r, *self.app.reuse_defaults, cv_frac, jagg_until_step, steps
        )

    def duplicate(self, run_id: Any) -> tuple[Any, ...]:
        """The New run form filled with run ``run_id``'s config (other fields as overrides), the tab switched
        to it, a note, and the form's launch message cleared; on a bad id the form is left as it is."""
        try:
            number = self.app.resolve(run_id)
            run = self.store.get_run(number) if number is not None else None
            if run is None:
                raise ConfigError("No run selected." if number is None else f"run id: no run #{number}")
            values = config_form_values(run["config"])
        except ConfigError as exc:
            return (*(gr.skip() for _ in FORM_FIELDS), gr.skip(), f"**Error:** {md_message(exc)}", gr.skip())
        note = f"New run form filled with run #{number}'s config: change a field and press Launch."
        return (*values, gr.update(selected="new"), note, "")  # "": the last launch's message is gone


def view_of(metric_keys: Any, smoothing: Any, log_y: Any, x: Any) -> metrics.MetricView:
    """The metrics view's controls → a MetricView (ConfigError in one line for a bad value)."""
    try:
        return metrics.check_view(metric_keys, smoothing, log_y, x)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class LiveHandlers(_Part):
    """Live: the registry's panels, the metrics view, the timer, the step slider, cancel and resume of the
    picked run (after a confirmation)."""

    def live_view(
        self,
        run_id: Any,
        r: float,
        metric_keys: Any = metrics.DEFAULT_METRICS,
        smoothing: Any = metrics.MetricView.smoothing,
        log_y: Any = False,
        x: Any = "step",
    ) -> tuple[Any, ...]:
        """(progress line, then one value per Live panel in registration order)."""
        try:
            number, ratio = self.app.resolve(run_id), parse_ratio(r, self.r0)
            view = view_of(metric_keys, smoothing, log_y, x)
        except ConfigError as exc:
            return (f"**Error:** {md_message(exc)}", *(p.empty("pick a run") for p in self.panels))
        run = self.store.get_run(number) if number is not None else None
        if run is None:
            note = "No run selected." if number is None else f"No run #{number}."
            return (note, *(p.empty("pick a run") for p in self.panels))
        ctx = panels.live_context(self.store, run, ratio, self.root, self.publish.items, view)
        shown = (client.attach_panel(p.name, panels.render(p, ctx), ctx) for p in self.panels)
        return (self._progress(run), *shown)

    def _progress(self, run: dict) -> str:
        return data.progress_markdown(run, self.store.last_values(run["id"], data.TRAINING_CLOCK_KEYS))

    def panel_view(
        self, name: str, run_id: Any, r: float, metric_keys: Any, smoothing: Any, log_y: Any, x: Any
    ) -> Any:
        """Panel ``name`` alone (a metric picked on Live redraws the metrics panel, nothing else); a bad
        control leaves it as drawn (:meth:`live_view` says why)."""
        panel = next(p for p in self.panels if p.name == name)
        try:
            number, ratio = self.app.resolve(run_id), parse_ratio(r, self.r0)
            view = view_of(metric_keys, smoothing, log_y, x)
        except ConfigError:
            return gr.skip()
        run = self.store.get_run(number) if number is not None else None
        if run is None:
            return gr.skip()
        ctx = panels.live_context(self.store, run, ratio, self.root, self.publish.items, view)
        return client.attach_panel(name, panels.render(panel, ctx), ctx)

    def streamed_view(
        self, run_id: Any, r: float, metric_keys: Any = metrics.DEFAULT_METRICS,
        smoothing: Any = metrics.MetricView.smoothing, log_y: Any = False, x: Any = "step", drawn: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        """:meth:`live_view` as the page gets it: (progress line, one value per panel, the new points of the
        plots the page holds, what the plots hold now). ``drawn``: the session's plots as last sent
        (:func:`app.stream.drawn_state`) for a tick of the same run, whose plots then get only their new
        points (the panel's value skipped, the change in the delta); None draws every panel whole."""
        progress, *shown = self.live_view(run_id, r, metric_keys, smoothing, log_y, x)
        try:
            number = self.app.resolve(run_id)
        except ConfigError:
            number = None
        values, plots, held = [], {}, {}
        for panel, value in zip(self.panels, shown, strict=True):
            sent, change, entry = stream.send(panel.name, value, number, drawn, drawn is not None)
            values.append(gr.skip() if sent is None else sent)
            if change is not None:
                plots[f"live-{panel.name}"] = change
            if entry is not None:
                held[panel.name] = entry
        delta = {"run": number, "plots": plots} if plots else gr.skip()
        return (progress, *values, delta, {"run": number, "panels": held})

    def panel_drawn(
        self,
        name: str,
        run_id: Any,
        r: float,
        metric_keys: Any,
        smoothing: Any,
        log_y: Any,
        x: Any,
        drawn: Any,
    ) -> tuple[Any, Any]:
        """:meth:`panel_view` with the session's record of what its plots hold updated (the panel sent whole)."""
        value = self.panel_view(name, run_id, r, metric_keys, smoothing, log_y, x)
        if not isinstance(value, go.Figure) or not isinstance(drawn, dict):
            return value, drawn
        try:
            number = self.app.resolve(run_id)
        except ConfigError:
            return value, drawn
        fig, _, entry = stream.send(name, value, number, None, False)
        if drawn.get("run") != number:
            return fig, drawn
        return fig, {**drawn, "panels": {**drawn.get("panels", {}), name: entry}}

    def metric_choices(self, number: int | None, picked: Any) -> Any:
        """The metric picker's choices: every key the run logged (and what is picked, so it stays)."""
        frame = self.store.metrics_frame(number) if number is not None else pd.DataFrame()
        keys = metrics.metric_keys([frame])
        kept = [k for k in (picked or []) if isinstance(k, str)]
        return gr.update(choices=sorted(set(keys) | set(kept)))

    def live_refresh(
        self, run_id: Any, r: float, metric_keys: Any = metrics.DEFAULT_METRICS, smoothing: Any = 0.6,
        log_y: Any = False, x: Any = "step", kind: str = "eval", seen: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        """The live view, the step slider on the run's last step with that step's images, the metric
        picker's choices, and the run's signature as drawn (so that the next tick neither redraws it nor
        moves a slider the user moved since). ``seen``: the signature the page drew last. The run it names drawn
        again (Refresh, or the picker's change event for the run already shown) leaves the slider's value and
        its images to the page: the slider follows the newest step only while it sits on the last one
        (client.SLIDER_JS), so a slider the user moved stays where it is, whatever ``step`` the server last
        heard of (the user's step reaches the server by a later event)."""
        number, sig = self._watched(run_id)
        bounds = samples.slider_range(self.store, number)
        kept = isinstance(seen, (list, tuple)) and len(seen) > 4 and number is not None and seen[0] == number
        gallery, note = (gr.skip(), gr.skip()) if kept else self.step_images(run_id, kind, bounds["maximum"])
        return (
            *self.streamed_view(run_id, r, metric_keys, smoothing, log_y, x),
            self.metric_choices(number, metric_keys),
            gallery,
            note,
            gr.update(**bounds) if kept else gr.update(**bounds, value=bounds["maximum"]),
            bounds["maximum"],  # the newest step, for the page's slider (client.SLIDER_JS)
            sig,
        )

    def _watched(self, run_id: Any) -> tuple[int | None, tuple]:
        """The watched run's number and its signature (on_tick's ``seen``) from the shared tick's reads; a
        run id that does not resolve has a signature of its own (live_view shows its one-line error once)."""
        try:
            number = self.app.resolve(run_id)
        except ConfigError:
            return None, ("invalid", repr(run_id))
        return number, self.app.shared.signature(number)

    def on_tick(
        self, run_id: Any, r: float, seen: Any, list_seen: Any, step: float | None = None, kind: str = "eval",
        metric_keys: Any = metrics.DEFAULT_METRICS, smoothing: Any = 0.6, log_y: Any = False, x: Any = "step",
        drawn: Any = None, held: Any = None,
    ) -> tuple:  # fmt: skip
        """Every open tab's timer lands here; ``shared`` does the queue pass and the reads once per tick. The
        live view is redrawn only when the watched run's signature changed, and then a plot the page holds
        gets only its new points (:mod:`app.stream`; ``drawn``: what the session's plots hold); the step
        slider follows the last
        step while it sits on it, and then its images are redrawn too (a new eval at the step the slider
        already shows changes the images, not the slider's value). ``held``: the revisions the page's plots
        hold (``jaggView.held``); a plot that holds another one than ``drawn`` says is sent whole, even on
        a tick with nothing new (:func:`app.stream.trusted`)."""
        self.app.shared.tick()
        drawn, off = stream.trusted(drawn, held)
        number, sig = self._watched(run_id)
        runs = self.app.shared.runs()
        runs_sig = tuple((x_["id"], x_["status"]) for x_ in runs)
        choices_update = (
            gr.update(choices=[(data.run_label(x_), x_["id"]) for x_ in runs])
            if list(runs_sig) != list(list_seen or [])
            else gr.skip()
        )
        if list(sig) == list(seen or []) and not off:
            return (
                *(gr.skip() for _ in range(1 + len(self.panels))),
                gr.skip(),  # no new points
                drawn,
                *(gr.skip() for _ in range(5)),  # metric picker, step gallery, step note, slider, newest
                seen,
                choices_update,
                runs_sig,
            )
        bounds = samples.slider_range(self.store, number)
        same_run = bool(seen) and len(seen) > 4 and seen[0] == number
        follow = not same_run or step is None or float(step) >= float(seen[4] or 0)
        # The slider's value is the page's to move (client.SLIDER_JS moves it to the newest step only while it
        # sits on the last one): a tick sent before the user moved the slider cannot move it back. Here the
        # images are drawn for a run drawn first, or for a new eval at the step the slider already shows.
        same_step = same_run and step is not None and float(step) == float(bounds["maximum"])
        images = follow and (not same_run or same_step)
        shown = self.step_images(run_id, kind, bounds["maximum"]) if images else (gr.skip(), gr.skip())
        return (
            *self.streamed_view(run_id, r, metric_keys, smoothing, log_y, x, drawn if same_run else None),
            self.metric_choices(number, metric_keys),
            *shown,
            gr.update(**bounds),
            # the newest step: the page moves the slider to it only while the slider, as the page shows it now,
            # sits on the newest step told before (client.SLIDER_JS); the server's idea of the slider lags
            bounds["maximum"],
            sig,
            choices_update,
            runs_sig,
        )

    def on_load(self, r: float, request: gr.Request | None = None) -> tuple[Any, ...]:
        """The page's first Live view: the run its address names (``?run=N``), else the newest live one. A
        Live link gets the picker and the progress line here, and its panels from the load's next step
        (:meth:`on_load_panels`): the page shows the line before it builds a plot (about 0.9 s sooner in
        headless Chromium, docs/app.md). A page that opens on another tab (the showcase, a Compare link) gets
        the picker alone, and the timer's first tick draws Live's panels after the view the page shows (the
        run not yet seen)."""
        view = client.view_from_query(getattr(request, "query_params", None) or {})
        asked = view.get("run")
        run_id = (
            asked if asked is not None and self.store.get_run(asked) is not None else self.app.default_run()
        )
        picker = gr.update(choices=self.app.run_choices(), value=run_id)
        if client.link_tab(view) != "live":
            # the panels, the delta and what is drawn, the metric picker, gallery, note, slider, newest, seen
            return (picker, *[gr.skip()] * (1 + len(self.panels) + 2 + 6))
        _, sig = self._watched(run_id)
        return (picker, self.progress_line(run_id), *[gr.skip()] * (len(self.panels) + 2 + 5), sig)

    def on_load_panels(self, run_id: Any, r: float, request: gr.Request | None = None) -> tuple[Any, ...]:
        """A Live link's panels, drawn once :meth:`on_load`'s progress line is in the page; nothing for a page
        that opens on another tab."""
        view = client.view_from_query(getattr(request, "query_params", None) or {})
        if client.link_tab(view) != "live":
            return tuple([gr.skip()] * (1 + len(self.panels) + 2 + 6))
        return self.live_refresh(run_id, r)

    def run_picked(
        self, run_id: Any, r: float, metric_keys: Any = metrics.DEFAULT_METRICS, smoothing: Any = 0.6,
        log_y: Any = False, x: Any = "step", kind: str = "eval", seen: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        """The picker's change: :meth:`live_refresh`, except for the run the page has just been told it shows
        (``seen`` is that run's signature now): a Live link's load set the picker, and its own next step
        draws the panels, so drawing them here too drew them twice."""
        _, sig = self._watched(run_id)
        if isinstance(seen, (list, tuple)) and list(seen) == list(sig):
            return tuple([gr.skip()] * (1 + len(self.panels) + 2 + 6))
        return self.live_refresh(run_id, r, metric_keys, smoothing, log_y, x, kind, seen)

    def progress_line(self, run_id: Any) -> str:
        """:meth:`live_view`'s progress line alone (what a Live link shows first)."""
        try:
            number = self.app.resolve(run_id)
        except ConfigError as exc:
            return f"**Error:** {md_message(exc)}"
        run = self.store.get_run(number) if number is not None else None
        if run is None:
            return "No run selected." if number is None else f"No run #{number}."
        return self._progress(run)

    def step_images(self, run_id: Any, kind: str, step: float | None) -> tuple[list, str]:
        """The run's ``kind`` images (eval | train) at the logged step nearest ``step``, and a note."""
        try:
            number = self.app.resolve(run_id)
            if kind not in samples.KINDS:
                raise ConfigError(f"images: must be one of {', '.join(samples.KINDS)}, got {brief(kind)}")
            step = _optional_number(step, "step")
        except ConfigError as exc:
            return [], f"**Error:** {md_message(exc)}"
        if number is None or self.store.get_run(number) is None:
            return [], "No run selected." if number is None else f"No run #{number}."
        shown, items = samples.step_gallery(self.store, number, self.root, kind, step)
        note = samples.steps_note(kind, shown, samples.sample_steps(self.store, number, kind))
        return self.publish.items(items), note

    def cancel(self, run_id: Any, request: gr.Request | None = None) -> str:
        return self.app.run_action(run_id, request, "cancel", "No run selected.")

    def cancel_answered(
        self, run_id: Any, confirmed: Any, request: gr.Request | None = None
    ) -> tuple[str, Any, None, str]:
        """Cancel run pressed and answered in the page (:data:`app.client.CANCEL_JS` asks at once, with no
        server round trip): (one line, Resume's question row hidden, no pending action, no question). Kept:
        nothing done; confirmed: the stop asked (or its one-line refusal: the showcase, another visitor's
        run, a run that has ended)."""
        hide = (gr.update(visible=False), None, "")
        try:
            number = self.app.resolve(run_id)
            run = self.store.get_run(number) if number is not None else None
            if run is None:
                raise ConfigError("No run selected." if number is None else f"run id: no run #{number}")
        except ConfigError as exc:
            return f"**Error:** {md_message(exc)}", *hide
        if confirmed is not True:
            return "Nothing done.", *hide
        refused = self.app.confirm.refusal("cancel", run, request)
        if refused:
            return f"**Refused.** {md_message(refused)}", *hide
        return self.app.run_action(number, request, "cancel", "No run selected."), *hide

    def resume_live(self, run_id: Any, request: gr.Request | None = None) -> str:
        return self.app.run_action(run_id, request, "resume", "No run selected.")

    def confirmed(self, pending: Any, request: gr.Request | None = None) -> tuple[str, Any, None]:
        """Confirm pressed: the pending cancel or resume of the run it named."""
        if not isinstance(pending, dict) or pending.get("action") not in ("cancel", "resume"):
            return "Nothing to confirm.", gr.update(visible=False), None
        answer = self.app.run_action(pending["run"], request, pending["action"], "No run selected.")
        return answer, gr.update(visible=False), None


def _optional_number(value: Any, field: str) -> float | None:
    """An optional number box: empty → None, else a finite number (ConfigError in one line naming ``field``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{field}: must be a number or empty, got {value!r}")
    return number


class HistoryHandlers(_Part):
    """Compare and History: side by side, the runs table, delete, export, resume, the owner's downloads."""

    def resume(self, run_id: float | None, request: gr.Request | None = None) -> str:
        return self.app.run_action(run_id, request, "resume", "Enter a run id.")

    COMPARE_OUTPUTS = (
        9  # message, showcase box, reward, metrics, time to reach, summary, diff, images, picker
    )

    def compare(
        self,
        run_ids: Any,
        r: float,
        x: Any = "step",
        metric_keys: Any = metrics.COMPARE_METRICS,
        smoothing: Any = metrics.MetricView.smoothing,
        log_y: Any = False,
        level: Any = None,
        at: Any = None,
    ) -> tuple[Any, ...]:
        """Only the picked runs: (one-line message, the showcase box shown only for the showcase's own runs,
        reward curves over ``x``, the metrics view, time to reach ``level`` (empty:
        :func:`app.metrics.default_level`, the lowest final eval above the runs' first evals), summary, config
        diff, images at each run's own first and last eval (and at step ``at``), the gallery's columns). An id
        that names no run is one line; the valid runs stay."""
        empty = (gr.update(visible=False), gr.update(visible=False), pd.DataFrame(), pd.DataFrame(),
                 pd.DataFrame(), gr.update(value=[]), gr.skip())  # fmt: skip
        ids, bad = self._picked(run_ids)
        try:
            ratio = parse_ratio(r, self.r0)
            view = view_of(metric_keys, smoothing, log_y, x)
            wanted = _optional_number(level, "reward level")
            step = _optional_number(at, "images at step")
        except ConfigError as exc:
            # one line naming the control; what is drawn stays
            return (f"**Error:** {md_message(exc)}", *(gr.skip() for _ in range(len(empty) + 1)))
        runs = [self.store.get_run(i) for i in ids]
        note = " ".join(f"**Not shown:** {md_message(b)}" for b in bad[:1]) + (
            f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        )
        showcase = gr.update(visible=bool(self.showcase_ids) and sorted(ids) == sorted(self.showcase_ids))
        if len(runs) < 2:
            return ((note + " · " if note else "") + "Pick two or more runs.", showcase, *empty)
        frames, by_label = self._frames(runs)
        reached, reach = self._reach(frames, by_label, wanted)
        note = " · ".join(part for part in (note, reached) if part)
        items, columns = data.side_by_side_own_steps(self.store, ids, self.root, at=step)
        return (
            note,
            showcase,
            gr.update(
                value=client.attach(
                    data.reward_figure(frames, title="Reward", x=view.x, runs=by_label),
                    frames,
                    by_label,
                    "reward",
                ),
                visible=True,
            ),
            gr.update(
                value=client.attach(
                    metrics.metrics_figure(frames, view, runs=by_label, title="Metrics"), frames, by_label
                ),
                visible=True,
            ),
            reach,
            data.compare_frame(self.store, ids, ratio),
            data.config_diff({f"#{run['id']}": run["config"] for run in runs}),
            gr.update(value=self.publish.items(items), columns=max(columns, 1)),
            gr.update(choices=sorted(set(metrics.metric_keys(list(frames.values()))) | set(view.metrics))),
        )

    def _picked(self, run_ids: Any) -> tuple[list[int], list[str]]:
        """The ids of the picked runs that exist (in order, once each) and a line per value that names none."""
        if run_ids is not None and not isinstance(run_ids, (list, tuple)):
            run_ids = [run_ids]
        ids, bad = [], []
        for value in run_ids or []:
            try:
                number = self.app.resolve(value, "runs")
            except ConfigError as exc:
                bad.append(str(exc))
                continue
            if number is not None and self.store.get_run(number) is None:
                bad.append(f"runs: no run #{number}")
            elif number is not None and number not in ids:
                ids.append(number)
        return ids, bad

    def _frames(self, runs: list[dict[str, Any]]) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
        """Label (``#3 jagg``) → metrics frame, and label → run row, of the picked runs."""
        labels = self._labels(runs)
        frames = {labels[run["id"]]: self.store.metrics_frame(run["id"]) for run in runs}
        return frames, {labels[run["id"]]: run for run in runs}

    @staticmethod
    def _labels(runs: list[dict[str, Any]]) -> dict[int, str]:
        """Run id → its label in Compare's plots and tables (``#3 jagg``)."""
        return {run["id"]: f"#{run['id']} {run['config'].get('strategy')}" for run in runs}

    def _reach(
        self, frames: dict[str, pd.DataFrame], by_label: dict[str, Any], wanted: float | None
    ) -> tuple[str, pd.DataFrame]:
        """The time-to-reach sentence and table at ``wanted`` (None: the default level)."""
        strategies = {label: run["config"].get("strategy") for label, run in by_label.items()}
        if wanted is None:
            found = metrics.default_level(frames, strategies)
            if found is None:  # no eval, or no final eval above the first evals: said so, no row
                return metrics.no_default_level(frames), metrics.reach_frame({}, 0.0)
            wanted, whose = found
        else:
            whose = "the level asked"
        return f"Time to reach eval reward {wanted:.4g} ({whose}).", metrics.reach_frame(frames, wanted)

    def _picked_frames(self, run_ids: Any) -> tuple[dict[str, pd.DataFrame], dict[str, Any]] | None:
        """The frames and runs by label of a Compare's picked runs, or None with fewer than two (a component
        redrawn alone keeps what the last full Compare drew)."""
        ids, _ = self._picked(run_ids)
        runs = [self.store.get_run(i) for i in ids]
        return self._frames(runs) if len(runs) >= 2 else None

    def compare_metrics(
        self, drawn: Any, run_ids: Any, x: Any, metric_keys: Any, smoothing: Any, log_y: Any
    ) -> tuple[Any, Any]:
        """A metric picked or dropped: (message, the metrics plot of the runs ``drawn``) and nothing else
        redrawn; a bad control is its one line and the plot stays. ``drawn``: the runs Compare's plots show
        (the session's, set by the last Compare or a link's load; None: the picker's ``run_ids``, as at the
        first paint). Not the picker's value: a link's load sets the metrics picked, and the page sends that
        change with the picker's value from before the load (the showcase's runs)."""
        run_ids = drawn if drawn is not None else run_ids
        try:
            view = view_of(metric_keys, smoothing, log_y, x)
        except ConfigError as exc:
            return f"**Error:** {md_message(exc)}", gr.skip()
        picked = self._picked_frames(run_ids)
        if picked is None:
            return gr.skip(), gr.skip()
        frames, by_label = picked
        fig = metrics.metrics_figure(frames, view, runs=by_label, title="Metrics")
        return gr.skip(), gr.update(value=client.attach(fig, frames, by_label), visible=True)

    def compare_shown(self, run_ids: Any) -> Any:
        """The "runs shown" boxes after a Compare: one per picked run, all ticked, in sight while the plots
        are (two runs or more)."""
        ids, _ = self._picked(run_ids)
        labels = list(self._labels([self.store.get_run(i) for i in ids]).values())
        return gr.update(choices=labels, value=labels, visible=True if len(ids) >= 2 else "hidden")

    def compare_drawn(self, run_ids: Any) -> tuple[Any, Any, Any]:
        """After a Compare: (the "runs shown" boxes, the runs drawn, the view's controls in sight while the
        plots are, out of sight otherwise: they act on no other plot)."""
        shown = self.compare_shown(run_ids)
        return shown, run_ids, gr.update(visible=shown["visible"])

    def compare_images(self, run_ids: Any, at: Any) -> tuple[Any, Any]:
        """The images' extra step changed: (message, the gallery) and nothing else redrawn."""
        try:
            step = _optional_number(at, "images at step")
        except ConfigError as exc:
            return f"**Error:** {md_message(exc)}", gr.skip()
        ids, _ = self._picked(run_ids)
        if len(ids) < 2:
            return gr.skip(), gr.skip()
        items, columns = data.side_by_side_own_steps(self.store, ids, self.root, at=step)
        return gr.skip(), gr.update(value=self.publish.items(items), columns=max(columns, 1))

    def report(
        self, run_ids: list[int] | None, r: float, request: gr.Request | None = None
    ) -> tuple[str, str | None]:
        """`jagg report` of the picked runs: one self-contained HTML file to download and share."""
        out_dir = session_export_dir(session(request)) if self.space else self.root / "exports"
        try:
            ratio = parse_ratio(r, self.r0)
        except ConfigError as exc:
            return f"**Error:** {md_message(exc)}", None
        message, path = report_for_app(self.store, run_ids if run_ids is not None else [], out_dir, r=ratio)
        if message.startswith("**Error:** "):  # it may echo what the visitor sent
            message = f"**Error:** {md_message(message[len('**Error:** ') :])}"
        if path is not None and self.space:
            prune_exports(out_dir.parent, keep=[path])
        return message, (self.publish(path) if path is not None else None)

    def history(
        self, search: str | None = None, status: str | None = None, backbone: str | None = None,
        strategy: str | None = None,
    ) -> pd.DataFrame:  # fmt: skip
        """The runs table (human durations, notes), filtered by the search words and the three filters."""
        frame = data.history_frame(self.store, notes.read_notes(self.root))
        try:
            return data.filter_history(frame, search if isinstance(search, str) else "", status=status,
                                       backbone=backbone, strategy=strategy)  # fmt: skip
        except ValueError:
            return frame

    def history_tick(self, seen: Any, *filters: Any) -> tuple[Any, Any]:
        """The History tab's timer: the table again only when a run's status or step moved."""
        runs = self.app.shared.runs()
        sig = [[r["id"], r["status"], r.get("last_step")] for r in runs]
        if sig == (seen or None):
            return gr.skip(), seen
        return self.history(*filters), sig

    def pick_row(self, table: Any, evt: gr.SelectData = None) -> tuple[Any, str]:  # type: ignore[assignment]
        """A click on a row of the runs table picks its run: its id in the run id box, its note below."""
        if evt is None:
            return gr.skip(), gr.skip()
        try:
            row = evt.index[0] if isinstance(evt.index, (list, tuple)) else int(evt.index)
            run_id = (
                int(pd.DataFrame(table)["id"].iloc[row])
                if not isinstance(table, pd.DataFrame)
                else int(table["id"].iloc[row])
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return gr.skip(), gr.skip()
        return run_id, notes.read_notes(self.root).get(run_id, "")

    def load_note(self, run_id: Any) -> Any:
        """The note box when the run id changes: the note of the run it names, "" for one without a note or
        an id that names no run (Save never writes one run's note to another)."""
        try:
            number = parse_run_id(run_id)
        except ConfigError:
            return ""
        return notes.read_notes(self.root).get(number, "") if number is not None else ""

    def save_note(
        self, run_id: Any, text: str, request: gr.Request | None = None
    ) -> tuple[str, pd.DataFrame]:
        try:
            number = parse_run_id(run_id)
            if number is None:
                return "Enter a run id.", self.history()
            if self.store.get_run(number) is None:
                raise ConfigError(f"run id: no run #{number}")
            self.guard.check_action(
                session(request), number, "delete"
            )  # who may delete a run may annotate it
            saved = notes.set_note(self.root, number, text or "")
        except SpaceError as exc:
            return f"**Refused.** {exc}", self.history()
        except (ConfigError, notes.NoteError) as exc:
            return f"**Error:** {md_message(exc)}", self.history()
        kept = f" {md_message(saved.message)}" if saved.message else ""  # a damaged notes.json, kept aside
        return f"Note of run #{number} saved.{kept}", self.history()

    def confirmed(
        self, pending: Any, request: gr.Request | None = None
    ) -> tuple[str, Any, None, pd.DataFrame]:
        """Confirm pressed on the History tab: the pending delete or resume of the run it named."""
        hide = gr.update(visible=False)
        if not isinstance(pending, dict) or pending.get("action") not in ("delete", "resume"):
            return "Nothing to confirm.", hide, None, self.history()
        if pending["action"] == "resume":
            return self.resume(pending["run"], request), hide, None, self.history()
        message, table = self.delete(pending["run"], bool((pending.get("extra") or [False])[0]), request)
        return message, hide, None, table

    def delete(
        self, run_id: float | None, delete_files: bool, request: gr.Request | None = None
    ) -> tuple[str, pd.DataFrame]:
        try:
            number = parse_run_id(run_id)
            if number is None:
                return "Enter a run id.", self.history()
            if not isinstance(delete_files, bool) and delete_files is not None:
                raise ConfigError(f"also delete its folder: must be true or false, got {brief(delete_files)}")
            self.guard.check_action(session(request), number, "delete")
            removed = self.manager.delete(number, delete_files=bool(delete_files))
        except SpaceError as exc:
            return f"**Refused.** {md_message(exc)}", self.history()
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {md_message(exc)}", self.history()
        self.guard.forget(number)
        notes.set_note(self.root, number, "")
        return f"Run #{number} deleted{' with its folder' if removed else ''}.", self.history()

    def export(self, run_id: float | None, request: gr.Request | None = None) -> tuple[str, list[str] | None]:
        # A visitor's exports go to a folder of their own session, never into the runs folder.
        out_dir = session_export_dir(session(request)) if self.space else self.root / "exports"
        try:
            number = parse_run_id(run_id)
            if number is None:
                return "Enter a run id.", None
            csv_path, json_path = self.store.export_run(number, out_dir)
        except (ConfigError, StoreError) as exc:
            return f"**Error:** {md_message(exc)}", None
        except OSError as exc:  # a read-only or full folder
            return cannot_write(out_dir, exc), None
        if self.space:
            prune_exports(out_dir.parent, keep=[csv_path, json_path])
        return f"Exported run #{number}.", [self.publish(csv_path), self.publish(json_path)]

    def login(self, password: str, request: gr.Request | None = None) -> str:
        return self.guard.login(session(request), password, client_address(request))

    def login_oauth(self, profile: gr.OAuthProfile | None, request: gr.Request | None = None) -> str:
        """On page load after "Sign in with Hugging Face": owner rights when the profile is the Space's
        author (gradio fills ``profile`` from the signed-in session)."""
        username = getattr(profile, "username", None) if profile is not None else None
        return md_message(self.guard.login_oauth(session(request), username))

    def owner_file(self, rel_path: str, request: gr.Request | None = None) -> tuple[str, str | None]:
        """A file of the runs folder (jagg.db, a checkpoint, a log), for the owner only."""
        try:
            self.guard.check_owner(session(request), "download")
            path = (self.root / (rel_path or "").strip()).resolve()
            if not path.is_relative_to(self.root) or not path.is_file():
                raise StoreError(f"download: no file {brief(rel_path)} in the runs folder")
        except (SpaceError, StoreError) as exc:
            return f"**Refused.** {md_message(exc)}", None
        if path.name == DB_NAME:  # a consistent copy of a live database (WAL): SQLite's backup
            copy = Path(tempfile.mkdtemp(prefix="jagg-owner-")) / DB_NAME
            with (
                closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)) as src,
                closing(sqlite3.connect(copy)) as dst,
            ):
                src.backup(dst)
            return f"{md_text(rel_path)}: {copy.stat().st_size:,} bytes.", str(copy)
        return f"{md_text(rel_path)}: {path.stat().st_size:,} bytes.", self.publish(path)
