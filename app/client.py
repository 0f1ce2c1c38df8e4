"""The metrics views' controls, applied in the page: smoothing, log scale, the x axis and the runs shown.

The server draws each Live and Compare plot once (and again when a run logs new steps); :func:`attach` puts,
in each trace's ``meta``, the series it was drawn from: the run's label, the trace's role, its values and
the four x axes of its points (step, wall time as Unix milliseconds, seconds since the run started, training
seconds with evals excluded). The page's script (:data:`SCRIPT`, in the page's head) recomputes a trace from
that series with plotly's own ``Plotly.update`` when a control moves: no server round trip, the other
components untouched. The same EMA as :func:`app.metrics.ema` (debiased, TensorBoard's) is computed there.

Compare's reward level is applied in the page too (:data:`REACH_JS`): the time-to-reach sentence and table are
computed from the eval traces' series (each point's training seconds are in the meta as ``train``), the same
rules as :func:`app.metrics.reach_frame` and :func:`app.metrics.default_level`.

The view's state (runs, metrics, axis, smoothing, log scale, reward level) is written to the page's query
string as it changes (``?tab=compare&runs=3,4&x=wall+time&smoothing=0.8``) so that a view can be shared and
survives a reload; :func:`view_from_query` reads it back on the server when the page loads.

Conventions borrowed from wandb and TensorBoard: the x axis, smoothing and log scale are view settings
applied to data the page already holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app import metrics

META_KEY = "jagg"  # trace.meta[META_KEY]: the series the page recomputes the trace from
ROLES = ("line", "raw", "fixed")  # smoothed when smoothing > 0 | the faint raw curve | drawn as logged
MARKERS_UP_TO = 24  # a curve of more points is drawn as a line (its points are in the hover)
QUERY_KEYS = ("tab", "run", "runs", "metrics", "x", "smoothing", "log", "level")


def _numbers(values: pd.Series) -> list[float | None]:
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]


def axes_of(frame: pd.DataFrame, run: Mapping[str, Any] | None) -> dict[str, list[float | None]]:
    """Each row's x on three of the axes: ``step``, ``wall`` (Unix ms, what a plotly date axis takes) and
    ``rel`` (seconds since the run started), as :func:`app.metrics.x_values` computes them (the fourth,
    training seconds, adds up over the whole history: :func:`training_meta`)."""
    wall = metrics.x_values(frame, run, "wall time")
    if pd.api.types.is_datetime64_any_dtype(wall):  # any resolution (pandas may keep seconds)
        epoch = pd.Timestamp(0, tz="UTC") if wall.dt.tz is not None else pd.Timestamp(0)
        wall_ms = (wall - epoch).dt.total_seconds() * 1000.0
    else:
        wall_ms = wall.astype(float)
    return {
        "step": _numbers(metrics.x_values(frame, run, "step")),
        "wall": _numbers(wall_ms),
        "rel": _numbers(metrics.x_values(frame, run, "relative time")),
    }


def training_meta(frame: pd.DataFrame, rows: pd.Index) -> dict[str, Any]:
    """The training seconds (eval excluded, :func:`app.metrics.training_seconds`) at ``rows`` of ``frame``
    (``train``) and at the run's last logged row (``train_total``): what the page's time to reach reads."""
    seconds = metrics.training_seconds(frame)
    total = seconds.dropna()
    return {
        "train": _numbers(seconds.loc[rows]) if len(rows) else [],
        "train_total": float(total.iloc[-1]) if len(total) and math.isfinite(total.iloc[-1]) else None,
    }


def series_meta(
    frame: pd.DataFrame,
    run: Mapping[str, Any] | None,
    label: str,
    key: str,
    role: str,
    values: pd.Series | None = None,
) -> dict[str, Any]:
    """The ``meta`` of a trace drawn from column ``key`` of ``frame`` (``values``: what it draws instead, on
    the same rows, e.g. a trailing mean): the rows that logged ``key``, their values and their four x (the
    training seconds, ``train``, from the whole history: they add up over every step); an eval trace's also
    the run's total training seconds (``train_total``, the time to reach's share)."""
    if role not in ROLES:
        raise ValueError(f"role: must be one of {', '.join(ROLES)}, got {role!r}")
    keep = frame[key].notna() if key in frame.columns else pd.Series(False, index=frame.index)
    rows = frame[keep]
    axes = axes_of(rows, run)
    y = (values if values is not None else frame[key])[keep] if len(rows) else pd.Series([], dtype=float)
    train = training_meta(frame, rows.index)
    if key != metrics.EVAL_KEY:
        del train["train_total"]
    return {META_KEY: {"run": label, "key": key, "role": role, "y": _numbers(y), **axes, **train}}


def _split(name: str, labels: list[str]) -> tuple[str, str] | None:
    """(run label, series name) of a trace named ``<label> · <series>`` (or ``<series>`` with one run
    labelled "")."""
    for label in sorted(labels, key=len, reverse=True):
        if label and name.startswith(f"{label} · "):
            return label, name[len(label) + 3 :]
    return ("", name) if "" in labels else None


def attach(
    fig: go.Figure,
    frames: Mapping[str, pd.DataFrame],
    runs: Mapping[str, Mapping[str, Any]] | None = None,
    kind: str = "metrics",
) -> go.Figure:
    """Put in each trace of ``fig`` (a :func:`app.metrics.metrics_figure` for ``kind="metrics"``, a
    :func:`app.data.reward_figure` for ``kind="reward"``, over the same ``frames`` and ``runs``) the series
    the page recomputes it from. A trace whose name names no series is left as it is (the page leaves it
    alone). Returns ``fig``."""
    from app.data import TREND_MIN_STEPS, TREND_STEPS

    labels = list(frames)
    for trace in fig.data:
        found = _split(str(trace.name or ""), labels)
        if found is None:
            continue
        label, series = found
        frame, run = frames[label], (runs or {}).get(label)
        if kind == "metrics":
            key, role = (series[: -len(" (raw)")], "raw") if series.endswith(" (raw)") else (series, "line")
            values = None
        elif series == "eval":
            key, role, values = metrics.EVAL_KEY, "fixed", None
        elif series.startswith("total, mean of last"):
            key, role = "reward/mean", "fixed"
            values = frame[key].dropna().rolling(TREND_STEPS, min_periods=TREND_MIN_STEPS).mean()
            values = values.reindex(frame.index)
        else:
            key, role, values = (
                ("reward/mean" if series == "total" else f"reward/{series}/mean"),
                "fixed",
                None,
            )
        if key not in frame.columns:
            continue
        trace.meta = series_meta(frame, run, label, key, role, values)
        if trace.mode == "lines+markers" and len(trace.meta[META_KEY]["y"]) > MARKERS_UP_TO:
            trace.mode = "lines"  # a marker per point of a long curve: clutter, and most of a redraw's time
    fig.update_layout(meta={META_KEY: {"kind": kind}})
    return fig


PANEL_KINDS = {"reward": "reward", "metrics": "metrics"}  # the Live panels the page recomputes


def attach_panel(name: str, value: Any, ctx: Any) -> Any:
    """A Live panel's value with its series attached (:func:`attach`) when it is one of
    :data:`PANEL_KINDS` and a figure; any other value as it is. ``ctx``: the :class:`app.panels.LiveContext`
    the panel was drawn from."""
    if name not in PANEL_KINDS or not isinstance(value, go.Figure):
        return value
    try:
        if name == "reward":  # the run and, for a run of a pair, its pair (the panel's own series)
            from app.panels import reward_series

            frames, runs, _ = reward_series(ctx)
            return attach(value, frames, runs, "reward")
        return attach(value, {"": ctx.frame}, {"": ctx.run}, PANEL_KINDS[name])
    except Exception:  # the panel as drawn, its controls then act through the server only
        return value


# ---------------------------------------------------------------------------------------------- the URL


def view_from_query(params: Mapping[str, str]) -> dict[str, Any]:
    """The view a query string names (the page writes it as its controls move): ``tab`` (live | compare),
    ``run`` (Live's run), ``runs`` (Compare's, comma-separated ids), ``metrics`` (comma-separated keys),
    ``x`` (one of :data:`app.metrics.X_AXES`), ``smoothing``, ``log`` (1 | 0), ``level``. Values that do
    not parse are left out (the control keeps its default): a shared link never breaks the page."""
    view: dict[str, Any] = {}
    tab = params.get("tab")
    if tab in ("live", "compare"):
        view["tab"] = tab
    run = (params.get("run") or "").strip().lstrip("#")
    if run.isdigit():
        view["run"] = int(run)
    ids = [part.strip().lstrip("#") for part in (params.get("runs") or "").split(",")]
    ids = [int(part) for part in ids if part.isdigit()]
    if ids:
        view["runs"] = list(dict.fromkeys(ids))
    keys = [part.strip() for part in (params.get("metrics") or "").split(",") if part.strip()]
    if keys:
        view["metrics"] = keys
    if params.get("x") in metrics.X_AXES:
        view["x"] = params["x"]
    try:
        smoothing = float(params.get("smoothing", "nan"))
    except ValueError:
        smoothing = math.nan
    if 0.0 <= smoothing < 1.0:
        view["smoothing"] = smoothing
    if params.get("log") in ("0", "1"):
        view["log_y"] = params["log"] == "1"
    level = (params.get("level") or "").strip()
    try:
        if level and math.isfinite(float(level)):
            view["level"] = level
    except ValueError:
        pass
    return view


def link_tab(view: Mapping[str, Any]) -> str | None:
    """The tab a link's view (:func:`view_from_query`) opens on: its ``tab``, else Compare for ``runs``, Live
    for ``run``; None for a page with no link (the first screen)."""
    return view.get("tab") or ("compare" if "runs" in view else "live" if "run" in view else None)


# ---------------------------------------------------------------------------------------------- the page's script

# window.jaggView: apply(plotIds, view) recomputes every trace that carries meta.jagg and relayouts its axes
# in one Plotly.update per plot; url(state) writes the view to the query string. view = {x, smoothing, log,
# shown}: x one of "step" | "wall time" | "relative time", smoothing in [0, 1), log (null: leave the y axes
# as they are), shown (null: every run; else the run labels to show).
SCRIPT = r"""<style>.jagg-stale, .jagg-stale * { visibility: hidden !important; }</style><script>
(() => {
  const AXES = {"step": "step", "wall time": "wall", "relative time": "rel", "training time": "train"};
  const TITLES = __AXIS_TITLES__;  // app.metrics.AXIS_TITLES
  const LOG_NOTE = __LOG_NOTE__;  // app.metrics.LOG_NOTE
  const ema = (ys, w) => {  // app.metrics.ema: debiased, gaps skipped
    const out = new Array(ys.length).fill(null);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const v = ys[i];
      if (v === null || !Number.isFinite(v)) continue;
      n += 1;
      last = w * last + (1 - w) * v;
      out[i] = w > 0 ? last / (1 - Math.pow(w, n)) : v;
    }
    return out;
  };
  const graph = (id) => document.querySelector("#" + id + " .js-plotly-plot");
  const series = (m, view, logged) => {
    const xs = m[AXES[view.x] || "step"], x = [], y = [];
    for (let i = 0; i < m.y.length; i++) {
      if (xs[i] === null || m.y[i] === null) continue;
      if (logged && !(m.y[i] > 0)) continue;  // log scale: only positive values have a place
      x.push(xs[i]);
      y.push(m.y[i]);
    }
    return {x, y: m.role === "line" && view.smoothing > 0 ? ema(y, view.smoothing) : y};
  };
  const apply = (ids, view) => {
    const started = performance.now(), done = [], per = {};
    for (const id of ids) {
      const gd = graph(id);
      if (!gd || !gd.data || !window.Plotly) continue;
      const kind = ((gd.layout.meta || {}).jagg || {}).kind;
      const logged = kind === "metrics" && !!view.log;
      const x = [], y = [], visible = [], idx = [];
      let lo = Infinity, hi = -Infinity;
      gd.data.forEach((t, i) => {
        const m = (t.meta || {}).jagg;
        if (!m) return;
        const s = series(m, view, logged);
        for (const v of s.x) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
        const shown = !view.shown || view.shown.includes(m.run);
        x.push(s.x); y.push(s.y); idx.push(i);
        visible.push(shown && (m.role !== "raw" || view.smoothing > 0));
      });
      if (!idx.length) continue;
      // what this plot's drawing depends on: a reward plot has no smoothing or log scale
      const key = JSON.stringify(kind === "metrics" ? view : {x: view.x, shown: view.shown});
      if (gd.data[idx[0]]._jaggView === key) continue;  // this view is drawn on these traces already
      idx.forEach((i) => { gd.data[i]._jaggView = key; });
      const layout = {};
      const date = view.x === "wall time", steps = view.x === "step";
      for (const key of Object.keys(gd._fullLayout || gd.layout)) {
        if (/^xaxis\d*$/.test(key)) {
          layout[key + ".type"] = date ? "date" : "linear";
          layout[key + ".autorange"] = true;
          layout[key + ".tickformat"] = steps ? "d" : "";
          const short = steps && hi - lo <= 12;
          layout[key + ".dtick"] = short ? 1 : null;
          layout[key + ".tick0"] = short ? 0 : null;
          const title = (gd.layout[key] || {}).title;
          if (title && (title.text || typeof title === "string")) layout[key + ".title.text"] = TITLES[view.x];
        }
        if (kind === "metrics" && /^yaxis\d*$/.test(key)) {
          layout[key + ".type"] = logged ? "log" : "linear";
          layout[key + ".autorange"] = true;
        }
      }
      if (kind === "metrics") {  // app.metrics.log_note: a plot with no positive value to place says so
        const plots = {};
        gd.data.forEach((t) => {
          const m = (t.meta || {}).jagg;
          if (!m) return;
          const ya = t.yaxis || "y", p = plots[ya] || (plots[ya] = {key: m.key, xa: t.xaxis || "x", positive: false});
          if (m.y.some((v) => v !== null && v > 0)) p.positive = true;
        });
        const notes = logged ? Object.entries(plots).filter(([, p]) => !p.positive).map(([ya, p]) => ({
          text: p.key + ": no positive values for a log axis; untick log scale", name: LOG_NOTE, showarrow: false,
          x: 0.5, y: 0.5, xref: p.xa + " domain", yref: ya + " domain"})) : [];
        const kept = (gd.layout.annotations || []).filter((a) => a.name !== LOG_NOTE);
        if (notes.length || kept.length !== (gd.layout.annotations || []).length) layout.annotations = [...kept, ...notes];
      }
      if (kind === "metrics" && gd.layout.title) {
        const text = String(gd.layout.title.text || gd.layout.title).replace(/ \(EMA [^)]*\)$/, "");
        layout["title.text"] = text + (view.smoothing > 0 ? " (EMA " + view.smoothing + ")" : "");
      }
      const t = performance.now();
      done.push(window.Plotly.update(gd, {x, y, visible}, layout, idx));
      per[id] = performance.now() - t;
    }
    const ms = performance.now() - started;  // plotly draws synchronously; its promises settle after
    if (done.length) window.jaggView.last = {ms, view, ids, per};
    return Promise.all(done);
  };
  const url = (state) => {
    const q = new URLSearchParams(window.location.search);
    for (const [k, v] of Object.entries(state)) {
      const text = Array.isArray(v) ? v.join(",") : v === true ? "1" : v === false ? "0" : v;
      if (text === null || text === undefined || text === "") q.delete(k); else q.set(k, String(text));
    }
    const search = q.toString();
    window.history.replaceState(null, "", window.location.pathname + (search ? "?" + search : ""));
  };
  // The controls act on the DOM event itself (not after gradio's event round): the view is read from the
  // controls as they are now and applied at the next frame. Gradio's change events apply it again for a value
  // set by the server (a link's view on load); the same view on the same traces is not drawn twice.
  const PAGES = {
    compare: {plots: ["compare-plot", "compare-metrics"], prefix: "compare", shown: "compare-shown"},
    live: {plots: ["live-reward", "live-metrics"], prefix: "live"},
  };
  const read = (page) => {
    const p = PAGES[page], q = (s) => document.querySelector("#" + p.prefix + "-" + s);
    const x = q("x") && q("x").querySelector("input:checked");
    const number = q("smoothing") && q("smoothing").querySelector("input[type=number]");
    const log = q("log-scale") && q("log-scale").querySelector("input");
    const boxes = p.shown && document.querySelector("#" + p.shown);
    const shown = boxes ? [...boxes.querySelectorAll("label")].filter((l) => {
      const i = l.querySelector("input"); return i && i.checked;
    }).map((l) => l.textContent.trim()) : null;
    return {x: x ? x.value : "step", smoothing: number ? Number(number.value) || 0 : 0,
            log: log ? log.checked : false, shown};
  };
  let pending = null;
  const onControl = (event) => {
    const t = event.target;
    if (!t || !t.closest) return;
    for (const [page, p] of Object.entries(PAGES)) {
      const ids = ["x", "smoothing", "log-scale"].map((s) => "#" + p.prefix + "-" + s);
      if (p.shown) ids.push("#" + p.shown);
      if (!ids.some((id) => t.closest(id))) continue;
      if (pending) cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => {
        pending = null;
        const view = read(page);
        apply(p.plots, view);
        url({tab: page, x: view.x, smoothing: view.smoothing, log: view.log});
      });
    }
  };
  document.addEventListener("change", onControl, true);
  document.addEventListener("input", onControl, true);
  // The step slider moved by the user (a trusted event: a drag, a key, a typed step), not by a refresh.
  const onSlider = (event) => {
    if (event.isTrusted && event.target && event.target.closest && event.target.closest("#step-slider"))
      window.jaggView.movedRun = shownRun();
  };
  document.addEventListener("input", onSlider, true);
  document.addEventListener("change", onSlider, true);
  // Live: the panels show only while the progress line names the run picked (a run switch, or a refresh
  // sent for the previous run and answered after the switch, hides them until the new run's arrive).
  // The run watched is the one the picker shows (its box, while the user is not typing in it): an event's
  // argument can be stale (the page's load event carries the picker's value before the address's run was put
  // in it; a change event can land late), the box cannot.
  let watched = null, looping = false, panelIds = null, check = () => null;
  let picked = null;  // a run picked from the list that gradio has not reported yet: {run, at}
  const runId = (run) => {
    const m = String(run === null || run === undefined ? "" : run).match(/^\s*#?(\d+)/);
    return m ? m[1] : null;
  };
  const pickerRun = () => {  // the run the picker's box shows; undefined while the user types in it
    const box = document.querySelector("#live-run input");
    return !box || document.activeElement === box ? undefined : runId(box.value);
  };
  const lagging = (id) => picked && performance.now() - picked.at < 10000 && id !== picked.run;  // gradio lags
  const setWatched = (id) => { watched = id; };
  // the run the page shows now (for the step slider: what it was told and whether the user moved it are kept
  // per run, so that another run starts afresh and the same run, drawn again, keeps both)
  const shownRun = () => pickerRun() || watched;
  const watchRun = (run, ids, byUser = false) => {
    panelIds = ids;
    let id = runId(run);
    if (byUser) picked = {run: id, at: performance.now()};
    else if (lagging(id)) return;
    else if (!picked) {  // (a pick of the user's that the event confirms stands: the box may not show it yet)
      const shown = pickerRun();
      if (shown) id = shown;
    }
    setWatched(id);
    check = () => {
      const shown = pickerRun();
      if (picked && shown === picked.run) picked = null;  // the box shows the user's pick
      if (shown && shown !== watched && !lagging(shown)) setWatched(shown);
      const p = document.getElementById("live-progress");
      const ok = watched === null || !!(p && p.textContent.includes("Run #" + watched + " "));
      for (const id of ids) {
        const el = document.getElementById(id);
        if (el) el.classList.toggle("jagg-stale", !ok);
      }
    };
    if (!looping) {  // checked before every paint: what is painted agrees with the progress line
      looping = true;
      const loop = () => { check(); requestAnimationFrame(loop); };
      requestAnimationFrame(loop);
    }
    window.jaggView.check = check;
    check();
  };
  // A run picked from the list (a click, or Enter: the run pickers' script clicks the option) hides the
  // panels at once, before gradio's own change event for the picker.
  document.addEventListener("mousedown", (event) => {
    const li = event.target && event.target.closest && event.target.closest("#live-run li[data-index]");
    if (li && panelIds) watchRun(li.textContent.replace(/^\s*\u2713/, "").trim(), panelIds, true);
  }, true);
  // Typed and Enter without a list hit (the pickers' script then blurs the box, and gradio takes the text):
  // the text names the run.
  document.addEventListener("focusout", (event) => {
    const input = event.target;
    if (input && input.closest && input.closest("#live-run") && panelIds && /^\s*#?\d+/.test(input.value || ""))
      watchRun(input.value, panelIds, true);
  }, true);
  // Compare's reward level (REACH_JS): the time-to-reach sentence and table from the eval traces' series, by
  // the rules of app.metrics.reach_frame and default_level; a level that is not a number is its one line and
  // the table stays.
  const HEADERS = ["run", "reaches at step", "training time to reach (s)", "of its training time", "final eval"];
  const g4 = (v) => String(parseFloat(Number(v).toPrecision(4)));  // Python's :.4g for these magnitudes
  const fixed = (v, n) => Number(Number(v).toFixed(n));  // Python's round(v, n)
  const lastOf = (ys) => { for (let i = ys.length - 1; i >= 0; i--) if (ys[i] !== null) return ys[i]; return null; };
  const firstOf = (ys) => { for (const y of ys) if (y !== null) return y; return null; };
  const mdMessage = (text) => String(text).replace(/([\\`])/g, "\\$1").replace(/<(?=[A-Za-z\/!?])/g, "\\<")
    .replace(/\](?=[(\[:])/g, "\\]").split("://").join(":\\/\\/").split("www.").join("www\\.")
    .split("@").join("\\@");  // app.text.md_message
  const repr = (v) => (v.includes("'") && !v.includes('"') ? '"' + v + '"'
    : "'" + v.replace(/\\/g, "\\\\").replace(/'/g, "\\'") + "'");
  const NUMBER = /^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/;
  const reach = (plotId, level, message, table) => {
    const started = performance.now(), gd = graph(plotId), evals = [];
    for (const t of (gd && gd.data) || []) {
      const m = (t.meta || {}).jagg;
      if (m && m.key === "eval/reward/mean" && m.train && !evals.some((e) => e.run === m.run)) evals.push(m);
    }
    if (!evals.length) return [message, table];
    const text = level === null || level === undefined ? "" : String(level);
    let wanted, whose;
    if (!text.trim()) {  // app.metrics.default_level: the lowest final eval above every run's first eval
      const none = {headers: HEADERS, data: [], metadata: null};
      const withEval = evals.filter((m) => lastOf(m.y) !== null);
      if (!withEval.length) return ["", none];
      let start = null, first = null;
      for (const m of withEval) {
        const v = firstOf(m.y);
        if (first === null || v > first) [start, first] = [m.run, v];
      }
      const above = withEval.map((m) => [m.run, lastOf(m.y)]).filter(([, v]) => v > first);
      if (!above.length)
        return ["No reward level by default: no final eval is above " + start + "'s first eval (" + g4(first) +
                "), a level it has from its start; type a level.", none];
      let [label, low] = above[0];
      for (const [l, v] of above) if (v < low) [label, low] = [l, v];
      wanted = low;
      whose = withEval.length === 1 ? label + "'s final eval"
        : above.length === withEval.length ? "the lower of the final evals, " + label + "'s"
        : "the lowest final eval above the runs' first evals, " + label + "'s";
    } else if (NUMBER.test(text) && Number.isFinite(Number(text))) {
      wanted = Number(text);
      whose = "the level asked";
    } else {
      return ["**Error:** " + mdMessage("reward level: must be a number or empty, got " + repr(text)), table];
    }
    const data = evals.map((m) => {
      const final = lastOf(m.y), total = m.train_total;
      const finalCell = final === null ? null : fixed(final, 4);
      const hit = m.y.findIndex((v) => v !== null && v >= wanted);
      if (hit < 0) {
        let best = -1;
        m.y.forEach((v, i) => { if (v !== null && (best < 0 || v > m.y[best])) best = i; });
        const s = best < 0 ? null : m.train[best];
        const at = best < 0 ? "" : "step " + m.step[best] + (s !== null && Number.isFinite(s) ? " / " + s.toFixed(1) + " s" : "");
        const said = best < 0 ? "not reached (no eval logged)" : "not reached (best " + g4(m.y[best]) + " at " + at + ")";
        return [m.run, said, "not reached", "-", finalCell];
      }
      const s = m.train[hit];
      const share = !total || s === null ? "-" : (100 * s / total).toFixed(0) + " %";
      return [m.run, m.step[hit], s === null ? null : fixed(s, 2), share, finalCell];
    });
    window.jaggView.lastReach = {ms: performance.now() - started, level: wanted};
    return ["Time to reach eval reward " + g4(wanted) + " (" + whose + ").", {headers: HEADERS, data, metadata: null}];
  };
  // Live's plots after their first draw (app.stream): a tick's new points appended to the figure the page
  // holds, then the view controls applied to them; a page that holds another figure than the one a delta
  // extends (an answer overtaken by another) presses the hidden redraw button: the panels come whole.
  const getPath = (obj, path) => path.split(".").reduce((o, k) => (o === null || o === undefined ? o : o[k]), obj);
  const setPath = (obj, path, value) => {
    const keys = path.split(".");
    let o = obj;
    for (const k of keys.slice(0, -1)) {
      if (o[k] === null || typeof o[k] !== "object") o[k] = {};
      o = o[k];
    }
    o[keys[keys.length - 1]] = value;
  };
  // plotly's binary arrays ({dtype, bdata}: how a figure's numpy arrays arrive), which gd.data keeps as sent
  const TYPED = {f8: Float64Array, f4: Float32Array, i1: Int8Array, u1: Uint8Array, i2: Int16Array,
                 u2: Uint16Array, i4: Int32Array, u4: Uint32Array};
  const values = (v) => {
    if (v && typeof v === "object" && typeof v.bdata === "string" && TYPED[v.dtype]) {
      const text = atob(v.bdata), bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      return Array.from(new TYPED[v.dtype](bytes.buffer));
    }
    return Array.from(v || []);
  };
  const extend = (delta) => {
    if (!delta || !delta.plots || !window.Plotly) return Promise.resolve();
    if (watched !== null && delta.run !== null && String(delta.run) !== watched) return Promise.resolve();
    const started = performance.now(), done = [], ids = [];
    let stale = false;
    for (const [id, d] of Object.entries(delta.plots)) {
      const gd = graph(id);
      const held = gd && gd.layout && gd.layout.meta && gd.layout.meta.jagg ? gd.layout.meta.jagg.rev : null;
      if (!gd || !gd.data || held !== d.from || gd.data.length !== d.n) { stale = true; continue; }
      const data = gd.data.map((t) => Object.assign({}, t));
      for (const t of d.traces) {
        const trace = data[t.i];
        if (trace.meta) trace.meta = JSON.parse(JSON.stringify(trace.meta));
        for (const [path, tail] of Object.entries(t.append))
          setPath(trace, path, values(getPath(trace, path)).concat(tail));
        for (const [path, value] of Object.entries(t.set)) setPath(trace, path, value);
      }
      data.forEach((t) => { delete t._jaggView; });  // the view is applied again to the longer series
      const layout = JSON.parse(JSON.stringify(gd.layout));
      for (const [path, value] of Object.entries(d.layout)) setPath(layout, path, value);
      layout.datarevision = d.to;
      done.push(window.Plotly.react(gd, data, layout));
      ids.push(id);
    }
    window.jaggView.extended += ids.length;
    if (stale) {
      window.jaggView.resyncs += 1;
      const button = document.getElementById("live-resync");
      if (button) button.click();
    }
    return Promise.all(done).then(() => apply(ids, read("live"))).then(() => {
      window.jaggView.lastExtend = {ms: performance.now() - started, ids};
    });
  };
  // What Live's plots hold, for the timer's tick (app.stream.trusted): {"live-<panel>": revision}, the plots
  // not drawn yet left out.
  const held = () => {
    const out = {};
    for (const gd of document.querySelectorAll('[id^="live-"] .js-plotly-plot')) {
      const box = gd.closest('[id^="live-"]'), rev = ((gd.layout && gd.layout.meta) || {}).jagg;
      if (box && rev && typeof rev.rev === "string") out[box.id] = rev.rev;
    }
    return out;
  };
  // The tab shown, by its id (the tab buttons' labels: TAB_LABELS), and the address's tab selected by the page
  // itself as soon as the tab buttons exist (a link opens on its tab before any server call answers; the
  // server's load, app.client.load_view, selects the same one).
  const TAB_LABELS = __TAB_LABELS__;
  const shownTab = () => {
    const b = document.querySelector("button[role=tab][aria-selected=true]");
    const label = b ? b.innerText.trim() : null;
    return Object.keys(TAB_LABELS).find((k) => TAB_LABELS[k] === label) || null;
  };
  const addressTab = () => {
    const q = new URLSearchParams(window.location.search);
    const tab = q.get("tab") || (q.get("runs") ? "compare" : q.get("run") ? "live" : null);
    return tab && TAB_LABELS[tab] ? tab : null;
  };
  const openTab = (started) => {
    const tab = addressTab();
    if (!tab || shownTab() === tab) return;
    const button = [...document.querySelectorAll("button[role=tab]")].find(
      (b) => b.innerText.trim() === TAB_LABELS[tab]);
    if (button) button.click();
    else if (performance.now() - started < 60000) requestAnimationFrame(() => openTab(started));
  };
  requestAnimationFrame(() => openTab(performance.now()));
  window.jaggView = {apply, url, ema, read, watchRun, reach, extend, values, held, last: null, lastReach: null,
                     extended: 0, resyncs: 0, lastExtend: null, latest: null, latestRun: null, movedRun: null,
                     shownTab, shownRun};
})();
</script>"""


# The tabs' ids and labels (app.ui.build_layout), for the page's script.
TAB_LABELS = {"new": "New run", "live": "Live", "compare": "Compare", "tryit": "Try it", "history": "History"}
SCRIPT = (
    SCRIPT.replace("__TAB_LABELS__", json.dumps(TAB_LABELS))
    .replace("__LOG_NOTE__", json.dumps(metrics.LOG_NOTE))
    .replace("__AXIS_TITLES__", json.dumps(metrics.AXIS_TITLES))
)


# The step slider follows the newest step only while it sits on the last one the page was told of: decided
# here, in the page, with the slider's value as it is now (every refresh sends the newest step), so that a
# refresh sent before the user moved it never moves it back, and a slider the user puts back on the newest step
# follows the next one (the server's idea of the slider lags the page's by a round trip, while the newest step
# moves on). Before the page is told a newest step of the run it shows, it follows unless the user moved the
# slider on that run (both kept per run: another run starts afresh). A newest step past the slider's bounds as the page shows them (a refresh
# for the run before a switch, answered after the new run's bounds) is cut to them: gradio refuses a value past
# the slider's maximum with an error toast ("Value 12 is greater than maximum value 1").
SLIDER_JS = """(latest, current) => {
  const J = window.jaggView, run = J.shownRun();
  const before = J.latestRun === run ? J.latest : null;
  if (latest === null || latest === undefined) return current;
  const range = document.querySelector("#step-slider input[type=range]");
  const top = range && range.max !== "" ? Number(range.max) : NaN;
  if (Number.isFinite(top) && Number(latest) > top) latest = top;
  // the value as the page shows it now: a step typed or dragged that gradio has not taken yet counts
  const box = document.querySelector("#step-slider input[type=number]");
  if (box && box.value !== "" && Number.isFinite(Number(box.value))) current = Number(box.value);
  J.latest = latest;
  J.latestRun = run;
  const told = before !== null && before !== undefined;
  const follow = told ? current === null || Number(current) >= before : J.movedRun !== run;
  return follow ? latest : current;
}"""


# Live's Cancel run, asked in the page at once: (run, answer) → (run, whether the user confirmed). The run is
# named as the progress line names it ("#3 name") when that line is about the picked run, else as the picker
# shows it (a picked label, or what was typed); an empty picker asks nothing (the server says no run is selected).
CANCEL_JS = """(run, answer) => {
  const box = document.querySelector("#live-run input");
  let what = (box && box.value.trim()) || (run === null || run === undefined || run === "" ? "" : String(run));
  if (!what) return [run, false];
  const id = (what.match(/^#?(\\d+)/) || [])[1];
  const head = document.querySelector("#live-progress strong");
  const named = head ? head.innerText.trim() : "";
  if (id && named.startsWith("Run #" + id + " ")) what = named.slice(4);
  else if (/^\\d+$/.test(what)) what = "#" + what;
  return [run, window.confirm("Cancel run " + what + "? It stops within one step, keeping its last checkpoint.")];
}"""


# Compare's reward level, in the page (SCRIPT's reach): (level, message, table) → (message, table).
EXTEND_JS = "(delta) => { window.jaggView.extend(delta); }"
REACH_JS = "(level, message, table) => window.jaggView.reach('compare-plot', level, message, table)"


def tick_js(inputs: int) -> str:
    """The ``js=`` of Live's timer tick, whose last of ``inputs`` inputs is what the page's plots hold: the
    inputs as they are, that one read in the page (``jaggView.held``; None where the script is missing)."""
    return (
        f"(...args) => {{ const a = args.slice(0, {inputs}); "
        f"a[{inputs - 1}] = window.jaggView ? window.jaggView.held() : null; return a; }}"
    )


def switch_js(panel_ids: list[str]) -> str:
    """The ``js=`` of a run switch on Live (no outputs): the panels ``panel_ids`` are hidden while the
    progress line names another run than the one picked (:data:`SCRIPT`'s ``watchRun``), so that no panel
    of the previous run stays up while the new one is read, nor comes back with a refresh sent for it."""
    return f"(run) => {{ window.jaggView.watchRun(run, {panel_ids!r}); return []; }}"


def control_js(plot_ids: list[str], tab: str, fields: list[str], draw: bool = True) -> str:
    """The ``js=`` of an event with no server function and no outputs that writes the view to the query
    string and, with ``draw``, recomputes the plots ``plot_ids`` in the page (after the server drew a plot
    again: Compare pressed, a metric picked). ``fields`` names the event's inputs in order, among
    ``metrics``, ``smoothing``, ``log``, ``x`` (the metrics controls, :func:`app.layout.metric_controls`)
    and ``shown`` (the run labels to show; absent: every run)."""
    view = "{x: x, smoothing: Number(smoothing) || 0, log: !!log, " + (
        "shown: Array.isArray(shown) ? shown : null}" if "shown" in fields else "shown: null}"
    )
    state = "{tab: " + repr(tab) + ", metrics: metrics, x: x, smoothing: smoothing, log: !!log}"
    apply = f"window.jaggView.apply({plot_ids!r}, {view}); " if draw else ""
    return f"({', '.join(fields)}) => {{ {apply}window.jaggView.url({state}); return []; }}"


def url_js(tab: str, field: str) -> str:
    """The ``js=`` of an event that writes one input (``field``: run, runs or level) to the query string, only
    while its tab is the one shown: the server setting Live's run as a Compare link opens does not rewrite
    the link into a Live one."""
    return (
        f"(value) => {{ if (window.jaggView.shownTab() === {tab!r}) "
        f"window.jaggView.url({{tab: {tab!r}, {field}: value}}); return []; }}"
    )


def load_view(h: Any, r: float, request: Any = None) -> tuple[Any, ...]:
    """The page's view from its address, when the page loads: (the tab, Live's metrics controls, Compare's
    runs, its metrics controls and reward level, then Compare's outputs, its "runs shown" boxes, the runs
    drawn, the session's state that :meth:`app.handlers.HistoryHandlers.compare_metrics` reads, and the row of
    its metrics controls, in sight with the plots). A query
    that names no view changes nothing (every value skipped). ``h``: the app's :class:`app.handlers.Handlers`."""
    import gradio as gr

    view = view_from_query(getattr(request, "query_params", None) or {})
    controls = [
        gr.update(value=view["metrics"]) if "metrics" in view else gr.skip(),
        gr.update(value=view["smoothing"]) if "smoothing" in view else gr.skip(),
        gr.update(value=view["log_y"]) if "log_y" in view else gr.skip(),
        gr.update(value=view["x"]) if "x" in view else gr.skip(),
    ]
    compare_n = h.history.COMPARE_OUTPUTS + 1
    tab = link_tab(view)
    choices = gr.update(choices=h.run_choices())  # Compare's picker: the runs now, not the app's start's
    if tab != "compare":
        live = controls if tab == "live" else [gr.skip()] * 4
        tabs = gr.update(selected="live") if tab == "live" else gr.skip()
        return (tabs, *live, choices, *[gr.skip()] * 5, *[gr.skip()] * compare_n, gr.skip(), gr.skip())
    defaults = metrics.MetricView(metrics=metrics.COMPARE_METRICS)
    runs = view.get("runs")
    if (
        runs
    ):  # the x the plots are drawn on, also where the link names none (the radio opens on the showcase's)
        controls[3] = gr.update(value=view.get("x", defaults.x))
    shown = (
        h.history.compare(
            runs,
            r,
            view.get("x", defaults.x),
            view.get("metrics", list(defaults.metrics)),
            view.get("smoothing", defaults.smoothing),
            view.get("log_y", defaults.log_y),
            view.get("level"),
            None,
        )
        if runs
        else [gr.skip()] * (compare_n - 1)
    )
    level = gr.update(value=view["level"]) if "level" in view else gr.skip()
    picked = gr.update(choices=h.run_choices(), value=runs) if runs else choices
    boxes = h.history.compare_shown(runs) if runs else gr.skip()
    drawn = runs if runs else gr.skip()  # the session's runs drawn: a metric picked next redraws these
    row = gr.update(visible=boxes["visible"]) if runs else gr.skip()  # the view's controls, with the plots
    return (
        gr.update(selected="compare"),
        *[gr.skip()] * 4,
        picked,
        *controls,
        level,
        *shown,
        boxes,
        drawn,
        row,
    )


# ---------------------------------------------------------------------------------------------- wiring

LIVE_PLOTS = ["live-reward", "live-metrics"]
COMPARE_PLOTS = ["compare-plot", "compare-metrics"]


def wire(demo: Any, page: Any, h: Any) -> None:
    """The metrics views' events (inside the open Blocks ``demo``; ``page``: :func:`app.ui.build_layout`'s
    components, ``h``: the app's :class:`app.handlers.Handlers`):

    - smoothing, log scale and the x axis (Live and Compare) and the runs shown (Compare) act in the page
      (:data:`SCRIPT`), with no server function;
    - Compare's reward level recomputes its time-to-reach sentence and table in the page (:data:`REACH_JS`);
    - a metric picked redraws the metrics plot alone; Compare's extra image step the gallery alone (an
      invalid value: its one line, the rest kept);
    - each writes the view to the query string, which :func:`load_view` reads when the page loads.
    """
    import gradio as gr

    live, compare, new = page.live, page.compare, page.new
    private = {"api_visibility": "private", "show_progress": "hidden"}
    fields = ["metrics", "smoothing", "log", "x"]
    # smoothing, log scale and the x axis: the page's own listeners (SCRIPT), on the DOM event itself
    live.view.pick.change(
        None, live.view.inputs, None, js=control_js(LIVE_PLOTS, "live", fields, draw=False), **private
    )
    live.view.pick.change(
        lambda *a: h.live.panel_drawn("metrics", *a),
        [live.live_run, new.r_input, *live.view.inputs, page.live_drawn],
        [live.shown["metrics"], page.live_drawn],
        **private,
    )
    # Live's plots after the first draw: a tick's new points appended in the page (app.stream); a page that
    # holds another figure than the one a delta extends presses the hidden redraw button: every panel whole.
    live.delta.change(None, live.delta, None, js=EXTEND_JS, **private)
    live.resync_btn.click(
        h.live.streamed_view,
        [live.live_run, new.r_input, *live.view.inputs],
        [*live.outputs, live.delta, page.live_drawn],
        **private,
    )
    live.live_run.change(None, live.live_run, None, js=url_js("live", "run"), **private)
    # A run switch: the previous run's panels are hidden at once, until the progress line names the new run.
    ids = ["live-progress", *(f"live-{p.name}" for p in h.panels), "step-gallery", "step-note"]
    live.live_run.change(None, live.live_run, None, js=switch_js(ids), **private)
    demo.load(None, live.live_run, None, js=switch_js(ids), **private)  # the run the page opens on
    live.step_latest.change(
        None, [live.step_latest, live.step_slider], live.step_slider, js=SLIDER_JS, **private
    )

    shown_inputs = [*compare.view.inputs, compare.shown_runs]
    compare_js = control_js(COMPARE_PLOTS, "compare", [*fields, "shown"])
    compare.view.pick.change(
        h.history.compare_metrics,
        [page.compare_drawn, compare.compare_runs, compare.view.x, *compare.view.inputs[:3]],
        [compare.compare_msg, compare.metrics_plot],
        **private,
    ).then(None, shown_inputs, None, js=compare_js, **private)
    compare.level.change(
        None,
        [compare.level, compare.compare_msg, compare.reach_table],
        [compare.compare_msg, compare.reach_table],
        js=REACH_JS,
        **private,
    )
    compare.level.change(None, compare.level, None, js=url_js("compare", "level"), **private)
    compare.image_step.change(
        h.history.compare_images,
        [compare.compare_runs, compare.image_step],
        [compare.compare_msg, compare.compare_gallery],
        **private,
    )
    compare.compare_btn.click(None, compare.compare_runs, None, js=url_js("compare", "runs"), **private)
    # the picker's labels as the runs are now (a run created, or finished, since the page opened)
    compare.compare_runs.focus(
        lambda: gr.update(choices=h.run_choices()), None, compare.compare_runs, **private
    )
    # a plot drawn again by the server (Compare pressed) keeps the runs unticked in the page hidden
    compare.compare_plot.change(None, shown_inputs, None, js=compare_js, **private)


def loader(h: Any) -> Any:
    """:func:`load_view` as a gradio load handler (gradio passes the request to a parameter typed so)."""
    import gradio as gr

    def load(r: float, request: gr.Request | None = None) -> tuple[Any, ...]:  # None: called directly
        return load_view(h, r, request)

    # resolved types, not strings: gradio reads the annotation to pass the request
    load.__annotations__ = {"r": float, "request": gr.Request | None, "return": tuple}
    return load


def load_outputs(page: Any) -> list[Any]:
    """The outputs of :func:`load_view`, in its order."""
    live, compare = page.live, page.compare
    return [
        page.tabs,
        *live.view.inputs,
        compare.compare_runs,
        *compare.view.inputs,
        compare.level,
        *compare.outputs,
        compare.shown_runs,
        page.compare_drawn,
        compare.view.row,
    ]
