"""The Vote tab: a ``picks`` run's next group, voted on with buttons or the keyboard (1–9 pick, s skip).

A run whose rewards include ``picks`` (docs/picks.md) asks about some groups each step: their images lie in the
run folder and a pending row in the store's ``pick_groups``. This tab shows the oldest pending group of the
chosen run that has no vote of ``owner`` yet (images side by side, numbered 1…G, and the prompt), the counter of votes cast and wanted, the
preference model's held-back agreement per step, and "waiting for your picks" while the run waits. A click
(or a key) casts one vote through :meth:`jagg_engine.store.RunStore.cast_vote`, committed before the reply.

Who votes: locally, whoever reaches the app (it is the owner's). In a Space only the owner, signed in, votes; a
visitor's vote is refused in one line. The app votes as the voter ``owner``; a run that names another voter
(``reward_options.picks.voter``) refuses it, in one line.

Pure functions over the store (:func:`picks_runs`, :func:`vote_view`) apart from the handlers and the wiring;
nothing imports torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from app.handlers import session
from jagg_engine.store import StoreError

MAX_PICKS = 9  # number keys 1–9; a group of more samples is voted on by its first nine
VOTER = "owner"
KEYS_SCRIPT = """<script>
(() => {
  // Vote tab: 1-9 click "pick k", s clicks "skip", while the tab is shown and no text field has the focus.
  document.addEventListener("keydown", (e) => {
    const tab = document.getElementById("vote-tab");
    if (!tab || tab.offsetParent === null || e.ctrlKey || e.metaKey || e.altKey) return;
    const t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    const id = /^[1-9]$/.test(e.key) ? "vote-pick-" + e.key : (e.key === "s" ? "vote-skip" : null);
    const button = id && document.getElementById(id);
    if (button && button.offsetParent !== null) { e.preventDefault(); button.click(); }
  });
})();
</script>"""


def is_picks_run(run: dict[str, Any]) -> bool:
    return "picks" in ((run.get("config") or {}).get("rewards") or {})


def picks_runs(store: Any) -> list[dict[str, Any]]:
    """Runs that train on picks, the running ones first, newest first."""
    runs = [r for r in store.list_runs() if is_picks_run(r)]
    return sorted(runs, key=lambda r: (r["status"] != "running", -r["id"]))


def agreement_figure(store: Any, run_id: int) -> go.Figure:
    """The preference model's held-back agreement per step (and over every vote so far)."""
    frame = store.metric_series(run_id, ["picks/agreement", "picks/agreement_all"])
    fig = go.Figure()
    for key, name in (("picks/agreement", "this step's votes"), ("picks/agreement_all", "every vote so far")):
        if key in frame:
            rows = frame[["step", key]].dropna()
            fig.add_trace(go.Scatter(x=rows["step"], y=rows[key], mode="lines+markers", name=name))
    fig.add_hline(y=0.5, line_dash="dot", annotation_text="chance")
    fig.update_layout(
        title="preference model: agreement with held-back votes", xaxis_title="step", yaxis_title="agreement",
        yaxis_range=[0, 1], height=300, margin={"l": 40, "r": 10, "t": 40, "b": 40},
    )  # fmt: skip
    return fig


def counter(store: Any, run_id: int) -> str:
    """Votes cast and wanted (the run's ``picks/wanted``: its budget, or its asks over every step)."""
    cast = len(store.votes(run_id))
    wanted = store.last_values(run_id, ["picks/wanted"]).get("picks/wanted", (None, None))[1]
    if wanted is None or (isinstance(wanted, float) and math.isnan(wanted)):
        return f"votes cast: **{cast}**"
    return f"votes cast: **{cast}** of **{int(wanted)}** wanted ({max(int(wanted) - cast, 0)} still wanted)"


def vote_view(store: Any, run_id: int | None) -> dict[str, Any]:
    """What the tab shows for ``run_id``: ``status`` (a line), ``group`` (the pending group or None), ``images``
    ((absolute path, caption) in sample order), ``counter`` and ``figure``."""
    out: dict[str, Any] = {"status": "", "group": None, "images": [], "counter": "", "figure": None}
    if run_id is None:
        out["status"] = "No picks run: start one with `rewards: {picks: 1.0}` (docs/picks.md)."
        return out
    run = store.get_run(run_id)
    if run is None or not is_picks_run(run):
        out["status"] = f"Run #{run_id} does not train on picks." if run else f"No run #{run_id}."
        return out
    out["counter"], out["figure"] = counter(store, run_id), agreement_figure(store, run_id)
    if run["status"] != "running":
        out["status"] = f"Run #{run_id} is {run['status']}; votes are taken only while it runs."
        return out
    voted = {(v["step"], v["group_index"]) for v in store.votes(run_id) if v["voter"] == VOTER}
    pending = [g for g in store.pick_groups(run_id, "pending") if (g["step"], g["group_index"]) not in voted]
    if not pending:
        out["status"] = f"Run #{run_id} is sampling or training; its next groups come with its next step."
        return out
    group = pending[0]
    out["group"] = group
    out["images"] = [(str(Path(run["run_dir"]) / p), str(k + 1)) for k, p in enumerate(group["paths"])]
    more = f" ({len(pending) - 1} more after it)" if len(pending) > 1 else ""
    out["status"] = (
        f"**waiting for your picks** — step {group['step']}, group {group['group_index']}{more}: "
        f"“{group['prompt']}”. Pick the best (1–{min(group['size'], MAX_PICKS)}) or skip (s)."
    )
    return out


class Vote:
    """The Vote tab's handlers over the app's :class:`app.handlers.Handlers` (store, Space mode, guard,
    file publisher)."""

    def __init__(self, app: Any):
        self.app, self.store, self.space, self.guard = app, app.store, app.space, app.guard
        self.publish = app.publish

    def run_choices(self) -> list[tuple[str, int]]:
        return [(f"#{r['id']} {r['name']} ({r['status']})", r["id"]) for r in picks_runs(self.store)]

    def default_run(self) -> int | None:
        runs = picks_runs(self.store)
        return runs[0]["id"] if runs else None

    def _run_id(self, run_id: Any) -> int | None:
        try:
            return None if run_id in (None, "") else int(str(run_id).lstrip("#").split()[0])
        except (TypeError, ValueError):
            return None

    def show(self, run_id: Any) -> tuple[Any, ...]:
        """(status, gallery, counter, figure, group key, buttons' visibility …) for the tab."""
        view = vote_view(self.store, self._run_id(run_id))
        group = view["group"]
        size = group["size"] if group else 0
        key = [group["run_id"], group["step"], group["group_index"]] if group else None
        images = [(self.publish(path), caption) for path, caption in view["images"]]
        buttons = [gr.update(visible=k < size) for k in range(MAX_PICKS)]
        return (
            view["status"],
            images,
            view["counter"],
            view["figure"],
            key,
            *buttons,
            gr.update(visible=bool(group)),
        )

    def refresh(self, run_id: Any) -> tuple[Any, ...]:
        return ("", *self.show(run_id))

    def load(self) -> tuple[Any, ...]:
        run_id = self.default_run()
        return (gr.update(choices=self.run_choices(), value=run_id), "", *self.show(run_id))

    def cast(
        self, run_id: Any, key: Any, sample: int | None, choice: str, request: gr.Request | None = None
    ) -> tuple[Any, ...]:
        """One vote on the shown group; the reply (one line) and the tab's next view."""
        return (self.vote(key, sample, choice, request), *self.show(run_id))

    def vote(self, key: Any, sample: int | None, choice: str, request: gr.Request | None = None) -> str:
        """Cast one vote; the reply is one line (a refusal says why, nothing is written)."""
        if self.space and not self.guard.is_owner(session(request)):
            return "**Refused:** vote: only the Space's owner (signed in) votes on its runs."
        if not key or len(key) != 3:
            return "**Refused:** vote: no group is shown; nothing is waiting for your picks."
        run_id, step, group_index = (int(v) for v in key)
        choice = choice if choice in ("best", "worst") else "best"
        try:
            if sample is None:
                self.store.cast_vote(run_id, step, group_index, None, "skip", VOTER)
                return f"Skipped group {group_index} of step {step}."
            cast = self.store.cast_vote(run_id, step, group_index, sample, choice, VOTER)
        except StoreError as exc:
            return f"**Refused:** {' '.join(str(exc).split())}"
        said = f"Voted: image {sample + 1} is the {choice} of group {group_index}, step {step}."
        if cast["late"]:
            said += f" Step {step} went on without it; the preference model learns from it at the next step."
        return said


def vote_tab(choices: list[tuple[str, int]], value: int | None) -> SimpleNamespace:
    """The Vote tab's components (:mod:`app.vote`)."""
    with gr.Column(elem_id="vote-tab"):
        with gr.Row():
            run = gr.Dropdown(
                choices=choices, value=value, label="run (runs that train on picks)", allow_custom_value=True,
                elem_id="vote-run", scale=3,
            )  # fmt: skip
            mode = gr.Radio(
                ["best", "worst"], value="best", label="a pick marks the", elem_id="vote-mode", scale=1
            )
            refresh_btn = gr.Button("Refresh", scale=0)
        status = gr.Markdown(elem_id="vote-status")
        gallery = gr.Gallery(
            label="the group (1–9: pick, s: skip)", columns=4, height="auto", elem_id="vote-images"
        )
        with gr.Row():
            picks = [
                gr.Button(str(k + 1), elem_id=f"vote-pick-{k + 1}", visible=False) for k in range(MAX_PICKS)
            ]
            skip = gr.Button("skip (s)", elem_id="vote-skip", visible=False)
        message = gr.Markdown(elem_id="vote-msg")
        count = gr.Markdown(elem_id="vote-counter")
        figure = gr.Plot(label="agreement", elem_id="vote-agreement")
        key = gr.State(None)
    return SimpleNamespace(
        run=run, mode=mode, refresh_btn=refresh_btn, status=status, gallery=gallery, picks=picks, skip=skip,
        message=message, count=count, figure=figure, key=key,
    )  # fmt: skip


def wire(tab: SimpleNamespace, h: Vote, tick_s: float) -> None:
    """Connect the Vote tab to ``h``: the run picker, Refresh and a timer redraw it; each button casts a vote."""
    shown = [tab.status, tab.gallery, tab.count, tab.figure, tab.key, *tab.picks, tab.skip]
    replied = [tab.message, *shown]
    gr.on(None, h.load, None, [tab.run, *replied], api_visibility="private")
    tab.run.change(h.refresh, tab.run, replied, api_name="vote_view")
    tab.refresh_btn.click(h.refresh, tab.run, replied, api_visibility="private")
    gr.Timer(tick_s).tick(h.show, tab.run, shown, api_visibility="private", show_progress="hidden")

    def picker(k: int):
        def pick(run_id: Any, key: Any, mode: str, request: gr.Request = None) -> tuple[Any, ...]:  # type: ignore[assignment]
            return h.cast(run_id, key, k, mode, request)

        pick.__name__ = f"vote_pick_{k + 1}"
        return pick

    for k, button in enumerate(tab.picks):
        button.click(picker(k), [tab.run, tab.key, tab.mode], replied, api_visibility="private")

    def skip(run_id: Any, key: Any, request: gr.Request = None) -> tuple[Any, ...]:  # type: ignore[assignment]
        return h.cast(run_id, key, None, "skip", request)

    tab.skip.click(skip, [tab.run, tab.key], replied, api_visibility="private")

    def cast_vote(
        run_id: Any,
        step: Any,
        group: Any,
        sample: Any,
        choice: str,
        request: gr.Request = None,  # type: ignore[assignment]
    ) -> str:
        """The API's vote (gradio_client): sample counted from 1, as the buttons show it; choice best | worst | skip."""
        try:
            key = [int(run_id), int(step), int(group)]
            number = None if choice == "skip" else int(sample) - 1
        except (TypeError, ValueError):
            return "**Refused:** vote: run, step, group and sample must be integers."
        if choice not in ("best", "worst", "skip"):
            return f"**Refused:** vote choice: must be one of best, worst, skip, got {choice!r}"
        if number is not None and number < 0:
            return "**Refused:** vote sample: counted from 1."
        return h.vote(key, number, choice, request)

    inputs = [gr.Number(visible=False) for _ in range(4)] + [gr.Textbox(visible=False)]
    gr.Button(visible=False).click(cast_vote, inputs, tab.message, api_name="cast_vote")
