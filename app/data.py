"""Pure read-side functions of the app: run store → DataFrame, plotly figure, gallery items, text.

Nothing here launches, cancels or writes anything; every function takes a :class:`RunStore` (or rows and
frames read from one) and returns a value the UI shows. ``app/ui.py`` wires them to gr.Blocks; tests call
them directly on a temporary store filled with synthetic rows.

Metric keys are the store's (``reward/mean``, ``time/update`` …, see :mod:`jagg_engine.store`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app.metrics import empty_figure
from app.text import md_code_block, md_text
from jagg_engine.cost import predicted_speedup, switched_speedup  # noqa: F401 (the app's names for them)
from jagg_engine.report.figures import (  # noqa: F401 (the app's names for them)
    _COLORS,
    TIME_PHASES,
    TREND_MIN_STEPS,
    TREND_STEPS,
    _bars,
    reward_figure,
    reward_names,
    reward_svg,
    time_breakdown_figure,
)
from jagg_engine.report.images import (  # noqa: F401 (the app's names for them)
    IMAGE_SUFFIXES,
    RunImages,
    _caption,
    _eval_images,
    own_step_cells,
    safe_image_path,
)
from jagg_engine.report.tables import (  # noqa: F401 (the app's names for them)
    BASELINE_KEYS,
    HISTORY_COLUMNS,
    R_CPU,
    R_GPU,
    TRAINING_CLOCK_KEYS,
    _round,
    _show,
    compare_frame,
    config_diff,
    config_speedup,
    default_r,
    history_frame,
    human_duration,
    paired_exact_run,
    prediction_baseline,
    progress,
    progress_line,
    provisional,
    run_duration,
    run_label,
    seconds_per_step,
    speedup_baseline,
    speedup_frame,
    started_text,
    trained_steps,
    training_duration,
    update_time,
)
from jagg_engine.sde_kinds import SDE_KINDS  # noqa: F401 (the app's name for it)
from jagg_engine.store import RunStore, file_tail

# ---------------------------------------------------------------------------------------------- cost model
# predicted_speedup is jagg_engine.cost's (torch-free): the app and `jagg bench` print the same number.


# ---------------------------------------------------------------------------------------------- run tables


HISTORY_FILTERS = ("status", "backbone", "strategy")
ALL = "all"


def filter_history(frame: pd.DataFrame, search: str = "", **equal: str | None) -> pd.DataFrame:
    """The rows whose id, name or note holds every word of ``search`` (case-insensitive; ``12`` or ``#12``
    is run #12 itself, never #112) and whose status, backbone and strategy equal the ones given (None, "" or
    "all": any)."""
    keep = pd.Series(True, index=frame.index)
    text = (frame["name"].astype(str) + " " + frame["note"].astype(str)).str.lower()
    ids = frame["id"].astype(str)
    for word in (search or "").lower().split():
        number = word.removeprefix("#")
        by_id = ids == number if number.isdigit() else pd.Series(False, index=frame.index)
        keep &= text.str.contains(word, regex=False) | by_id
    for column, value in equal.items():
        if column not in HISTORY_FILTERS:
            raise ValueError(f"filter: must be one of {', '.join(HISTORY_FILTERS)}, got {column!r}")
        if value and value != ALL:
            keep &= frame[column].astype(str) == str(value)
    return frame[keep].reset_index(drop=True)


def progress_markdown(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None
) -> str:
    """A text progress bar: ``step 3/10 · 5.8 s/step · ETA 41 s ███░░░░░░░ 30 % · running``
    (:func:`progress_line`)."""
    done, steps = progress(run)
    frac = done / steps if steps else 0.0
    bar = "█" * round(20 * frac) + "░" * (20 - round(20 * frac))
    name = md_text(run["name"])  # a visitor's text: shown as typed, never as Markdown or HTML
    text = (
        f"**Run #{run['id']} {name}** — {progress_line(run, last)} `{bar}` {100 * frac:.0f} % · "
        f"**{run['status']}**"
    )
    if run.get("error"):
        text += "\n\n" + md_code_block(str(run["error"]))
    return text


# ---------------------------------------------------------------------------------------------- figures


def pass_counts_figure(
    frame: pd.DataFrame, title: str = "Transformer passes in the update phase"
) -> go.Figure:
    """count/forward and count/backward per step (JAGG: two backward passes per window)."""
    return _bars(
        frame, (("count/forward", "forward"), ("count/backward", "backward")), title, "group", "passes", 300
    )


def probe_figure(
    probes: Sequence[Mapping[str, Any]],
    title: str = "Gradient cosine, JAGG vs exact",
    route_frac: float | None = None,
    threshold: float | None = None,
) -> go.Figure:
    """Cosine per group index (high noise first), one line per probed step and method.

    With automatic routing, ``threshold`` is drawn as a dashed line and the title says which groups the
    latest routing (``route_frac`` of the groups, high noise first) sends to JAGG.
    """
    if not probes:
        return empty_figure(title, "no probes (set probe_every > 0 or auto_route=true)")
    n_groups = len({p["group_index"] for p in probes})
    if route_frac is not None and route_frac == route_frac:  # not NaN
        n = round(route_frac * n_groups)
        title += f" — routed to JAGG: {f'groups 0–{n - 1}' if n else 'none'} of {n_groups}"
    frame = pd.DataFrame(list(probes))
    frame = frame.groupby(["method", "step", "group_index"], as_index=False)["cosine"].mean()
    fig = go.Figure()
    for (method, step), rows in frame.groupby(["method", "step"]):
        rows = rows.sort_values("group_index")
        fig.add_trace(
            go.Scatter(
                x=rows["group_index"], y=rows["cosine"], mode="lines+markers", name=f"{method} @ step {step}"
            )
        )
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", annotation_text=f"auto_route threshold {threshold:g}")
    fig.update_layout(
        title=title, xaxis_title="group (0 = highest noise)", yaxis_title="cosine", yaxis_range=[-1.05, 1.05],
        height=300, margin={"l": 50, "r": 20, "t": 50, "b": 40},
    )  # fmt: skip
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------------------------------------- speedup


def paired_run(store: RunStore, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The other run of ``run``'s pair (linked either way by paired_run_id, whatever its strategy), if any."""
    if run.get("paired_run_id") is not None:
        other = store.get_run(run["paired_run_id"])
        if other is not None and other["id"] != run["id"]:
            return other
    return next(
        (r for r in store.list_runs() if r.get("paired_run_id") == run["id"] and r["id"] != run["id"]), None
    )


# ---------------------------------------------------------------------------------------------- compare


# ---------------------------------------------------------------------------------------------- images


def gallery_items(
    store: RunStore, run_id: int, runs_root: str | os.PathLike[str], kind: str = "eval", limit: int = 48
) -> list[tuple[str, str]]:
    """(image path, caption) of the run's samples, newest step first, then by prompt and seed; captions
    carry step, prompt, seed and reward. Paths outside the runs folder are dropped."""
    run = store.get_run(run_id)
    if run is None:
        return []
    images = RunImages(run["run_dir"], runs_root)
    if not images.exists:  # the run folder is gone: no image to look for
        return []
    samples = sorted(
        store.samples(run_id, kind), key=lambda s: (-s["step"], s.get("prompt") or "", s.get("seed") or 0)
    )
    items = []
    for s in samples:
        path = images.path(s["path"])
        if path is not None:
            items.append((path, _caption(s)))
        if len(items) >= limit:
            break
    return items


def side_by_side(
    store: RunStore, run_ids: Sequence[int], runs_root: str | os.PathLike[str], limit_pairs: int = 8
) -> list[tuple[str, str]]:
    """Eval images of the same prompt and seed from each run, at each run's last eval step, in rows of
    len(run_ids): [run A (p0, s0), run B (p0, s0), run A (p1, s0), …]. Only prompt+seed pairs every run
    has are shown."""
    per_run: list[dict[tuple[str, int], tuple[str, str]]] = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        images = RunImages(run["run_dir"] if run else None, runs_root)
        samples = store.samples(run_id, "eval") if images.exists else []
        if not samples:
            return []
        last = max(s["step"] for s in samples)
        found = {}
        for s in samples:
            if s["step"] != last:
                continue
            path = images.path(s["path"])
            if path is not None:
                found[(s.get("prompt") or "", s.get("seed") or 0)] = (
                    path,
                    f"#{run_id} {run['config'].get('strategy')} · " + _caption(s),
                )
        per_run.append(found)
    common = sorted(set.intersection(*(set(f) for f in per_run))) if per_run else []
    items = []
    for key in common[:limit_pairs]:
        items += [found[key] for found in per_run]
    return items


def side_by_side_first_last(
    store: RunStore, run_ids: Sequence[int], runs_root: str | os.PathLike[str], limit_keys: int = 8
) -> list[tuple[str, str]]:
    """Eval images of the same prompt and seed from each run at the first and at the last eval step that all
    runs logged, one row per prompt+seed: [run A first, run B first, …, run A last, run B last, …] (a gallery
    of 2·len(run_ids) columns). Up to ``limit_keys`` prompt+seed pairs every run has at both steps, spread
    evenly over them in (prompt, seed) order — never chosen by reward."""
    runs = [store.get_run(run_id) for run_id in run_ids]
    if not runs or any(run is None for run in runs):
        return []
    samples = {run["id"]: store.samples(run["id"], "eval") for run in runs}
    step_sets = [{s["step"] for s in rows} for rows in samples.values()]
    common_steps = sorted(set.intersection(*step_sets)) if all(step_sets) else []
    if not common_steps:
        return []
    first, last = common_steps[0], common_steps[-1]
    found = _eval_images(runs, samples, runs_root, {run["id"]: {first, last} for run in runs})
    cells = [(run["id"], step) for step in dict.fromkeys((first, last)) for run in runs]
    keys = sorted(set.intersection(*(set(found.get(cell, {})) for cell in cells)))
    if not keys:
        return []
    stride = max(1, len(keys) // max(1, limit_keys))
    items = []
    for key in keys[::stride][:limit_keys]:
        items += [found[cell][key] for cell in cells]
    return items


def side_by_side_own_steps(
    store: RunStore,
    run_ids: Sequence[int],
    runs_root: str | os.PathLike[str],
    at: float | None = None,
    limit_keys: int = 8,
) -> tuple[list[tuple[str, str]], int]:
    """Eval images of the same prompt and seed from each run at ITS OWN first and last eval step (a 6-step
    run shows step 6 beside a 4-step run's step 4), and with ``at`` also at each run's logged eval step
    nearest ``at``, the columns in step order (the ``at`` images between first and last when they lie
    there): one row per prompt+seed, [A first, B first, …, A at, B at, …, A last, B last, …]. Returns
    (items, columns). Up to ``limit_keys`` prompt+seed pairs every cell has, spread evenly over them in
    (prompt, seed) order — never chosen by reward. Captions name the run and the step."""
    items, cells = own_step_cells(store, run_ids, runs_root, at, limit_keys)
    return items, len(cells)


# ---------------------------------------------------------------------------------------------- timer


def run_signature(store: RunStore, run: Mapping[str, Any] | None) -> tuple:
    """What changes when a run's live view must be redrawn: status, last step, samples logged, log sizes.
    Cheap: the run row comes from a run list already read, the samples are counted through an index."""
    if run is None:
        return (None,)
    folder = Path(run["run_dir"] or ".")
    sizes = []
    for name in ("train.log", "stdout.log"):
        try:
            sizes.append((folder / name).stat().st_size)
        except OSError:
            sizes.append(-1)
    count, last = store.sample_count(run["id"])
    return (run["id"], run["status"], run["last_step"], count, last, *sizes)


def pair_signature(run: Mapping[str, Any] | None, runs: Sequence[Mapping[str, Any]]) -> tuple:
    """The status and last step of the run paired with ``run`` (linked either way), () without one: the view
    of a JAGG run that ended first is redrawn while its exact run trains on, so that the pair's measured
    speedup follows until both end instead of freezing at the value it had when JAGG ended."""
    if run is None:
        return ()
    for other in runs:
        if other["id"] != run["id"] and (
            other["id"] == run.get("paired_run_id") or other.get("paired_run_id") == run["id"]
        ):
            return ("pair", other["id"], other["status"], other.get("last_step"))
    return ()


class SharedTick:
    """The reads of the app's timer, done once per tick and shared by every open tab.

    Each tab's timer fires every few seconds; with N tabs, N timers would each run the queue and read the
    run list. Here the first caller in a tick does the work (:meth:`tick` runs the queue pass, :meth:`runs`
    reads the run list, :meth:`signature` a watched run's signature) and callers within ``max_age``
    seconds get the same result; concurrent callers wait for the read in flight instead of repeating it.
    """

    def __init__(
        self,
        store: RunStore,
        queue_tick: Callable[[], Any] | None = None,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.queue_tick = queue_tick
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.RLock()
        self._memo: dict[Hashable, tuple[float, Any]] = {}

    def _shared(self, key: Hashable, read: Callable[[], Any]) -> Any:
        with self._lock:
            now = self.clock()
            hit = self._memo.get(key)
            if hit is not None and 0 <= now - hit[0] < self.max_age:
                return hit[1]
            for old in [k for k, (t, _) in self._memo.items() if not 0 <= now - t < self.max_age]:
                del self._memo[old]  # runs no tab watches any more
            value = read()
            self._memo[key] = (now, value)
            return value

    def tick(self) -> None:
        """The queue pass (start queued runs, mark dead ones), at most once per ``max_age``."""
        if self.queue_tick is not None:
            self._shared("tick", self.queue_tick)

    def runs(self) -> list[dict[str, Any]]:
        """The run list (``store.list_runs()``) of this tick."""
        return self._shared("runs", self.store.list_runs)

    def signature(self, run_id: int | None) -> tuple:
        """:func:`run_signature` of ``run_id`` in this tick's run list, and its pair's (:func:`pair_signature`)."""
        if run_id is None:
            return (None,)

        def read() -> tuple:
            runs = self.runs()
            run = next((r for r in runs if r["id"] == run_id), None)
            return (*run_signature(self.store, run), *pair_signature(run, runs))

        return self._shared(("signature", run_id), read)


# ---------------------------------------------------------------------------------------------- logs


def log_tail(
    run_dir: str | os.PathLike[str] | None, lines: int = 40, max_bytes: int = 32_768, stdout: bool = False
) -> str:
    """The last lines of the run's train.log, else of stdout.log (what the subprocess printed); with
    ``stdout`` (a failed run: the traceback is there) stdout.log first."""
    if not run_dir:
        return ""
    for name in ("stdout.log", "train.log") if stdout else ("train.log", "stdout.log"):
        text = file_tail(Path(run_dir) / name, lines, max_bytes)
        if text.strip():
            return text
    return ""
