"""Runs as tables: labels, durations, progress, the run history, and speedups against the right exact
run (its pair, else one of the same batch and eval), measured and predicted."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from jagg_engine.cost import predicted_speedup, switched_speedup
from jagg_engine.sde_kinds import SDE_KINDS
from jagg_engine.store import RunStore

R_CPU = 1.8  # forward+backward / forward cost measured on the 2-core CPU (PAPER.md, cost model)


R_GPU = 3.0  # the theoretical ratio on GPUs


def trained_steps(config: Mapping[str, Any]) -> int:
    """Sampling steps a training step of this stored config trains: its fixed SDE window, or W under sliding
    and random (the schedules whose window of W steps moves)."""
    start = config.get("sde_window_start") or 0
    end = config.get("sde_window_end")
    if end is None:
        last_stochastic = SDE_KINDS[config.get("algorithm", "flow-grpo")].last_step_stochastic
        end = config["sampling_steps"] - (0 if last_stochastic else 1)
    if config.get("sde_window_schedule") in ("sliding", "random"):
        return min(int(config["window"]), end - start)
    return end - start


def config_speedup(
    config: Mapping[str, Any], r: float, exact_config: Mapping[str, Any] | None = None
) -> float | None:
    """The prediction for a stored run config (its W, jagg_frac, strategy, trained-step count, velocity reuse
    and mini-batches per rollout, control variate, and a switch to exact (or pair, ``switch_to``) over its steps; a config from before
    those fields ran without reuse, one update a rollout, no control variate, no switch).
    A sliding SDE window trains W steps a step, one group, wherever it stands.

    Against ``exact_config`` (the exact run it is measured against) that trains another number of steps a
    step (e.g. Flow-GRPO's whole range against a sliding window), the prediction is scaled by that ratio: the
    exact run's update costs its own trained steps × r."""
    try:
        steps = trained_steps(config)
        reuse = config.get("reuse_rollout_velocity") == "auto"
        updates = int(config.get("updates_per_rollout", 1))
        # pair reads every step's credit with its control variate or a mix (a config from before them: neither)
        credits = float(config.get("pair_cv") or 0.0) > 0 or float(config.get("pair_frac") or 1.0) < 1
        speedup = predicted_speedup(
            int(config["window"]),
            r,
            float(config["jagg_frac"]),
            config.get("strategy", "jagg"),
            steps,
            reuse=reuse,
            updates_per_rollout=updates,
            cv_frac=float(config.get("cv_frac") or 0.0),
            pair_credits=credits,
        )
        span = config.get("jagg_until_step"), config.get("jagg_from_step")
        if (
            span != (None, None) and config.get("strategy", "jagg") == "jagg"
        ):  # switch_to outside the JAGG span
            other = 1.0
            if config.get("switch_to", "exact") == "pair":
                other = predicted_speedup(
                    int(config["window"]), r, float(config["jagg_frac"]), "pair", steps, reuse, updates,
                    pair_credits=credits,
                )  # fmt: skip
            speedup = switched_speedup(speedup, int(config["steps"]), *span, other_speedup=other)
        return speedup if exact_config is None else speedup * trained_steps(exact_config) / steps
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def default_r(has_gpu: bool) -> float:
    return R_GPU if has_gpu else R_CPU


def run_label(run: Mapping[str, Any]) -> str:
    """``#12 tiny-shapes (jagg, running)`` — the name a dropdown shows for a run."""
    strategy = run.get("config", {}).get("strategy", "?")
    return f"#{run['id']} {run['name']} ({strategy}, {run['status']})"


def run_duration(run: Mapping[str, Any], now: float | None = None) -> float | None:
    """Wall seconds from start to finish (to now for a live run); None if it never started. A resumed run's
    span includes the time it sat idle between its attempts: :func:`training_duration` leaves that out."""
    start = run.get("started_at")
    if start is None:
        return None
    end = run.get("finished_at") or (now if now is not None else time.time())
    return max(0.0, float(end) - float(start))


TRAINING_CLOCK_KEYS = ("time/train_elapsed", "time/unix", "time/step")


def training_duration(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None
) -> float | None:
    """The run's training seconds: the trainer's clock at its last logged step (``time/train_elapsed``, from
    step 1 to the end of that step's update, evals and the idle time of a resumed run left out), read from
    ``last`` (:meth:`RunStore.last_values` of :data:`TRAINING_CLOCK_KEYS`). A history logged before that clock
    falls back to the wall span (:func:`run_duration`); None when the run never started."""
    value = (last or {}).get("time/train_elapsed", (None, None))[1]
    if value is not None and math.isfinite(float(value)):
        return max(0.0, float(value))
    return run_duration(run)


def seconds_per_step(
    run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None
) -> float | None:
    """Training seconds per step so far: the trainer's clock at the last step over the steps done (the
    steps of a resumed run's earlier attempts included, its idle time not); None before a step is logged."""
    step, elapsed = (last or {}).get("time/train_elapsed", (None, None))
    if step and elapsed is not None and math.isfinite(float(elapsed)) and step > 0:
        return float(elapsed) / int(step)
    return None


def human_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 04 min``; "" for None."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


HISTORY_COLUMNS = (
    "id", "name", "status", "backbone", "W", "jagg_frac", "strategy", "step",
    "final reward", "started", "duration", "paired", "note", "error",
)  # fmt: skip


def started_text(run: Mapping[str, Any]) -> str:
    """When the run first started, ``2026-12-03 07:32`` (UTC); "" if it never did."""
    start = run.get("started_at")
    return "" if start is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(float(start)))


def history_frame(store: RunStore, notes: Mapping[int, str] | None = None) -> pd.DataFrame:
    """Every run, newest first: id, name, status, backbone, W, jagg_frac, strategy, step (a running run's
    with its s/step and ETA, :func:`progress_line`), final reward, started (UTC), duration (its training
    time, :func:`training_duration`, as ``3 min 05 s``), paired run (an integer id), its note (``notes``: run
    id → text) and error."""
    rows = []
    for run in store.list_runs():
        cfg = run["config"]
        final = run.get("final_reward")
        last = store.last_values(run["id"], TRAINING_CLOCK_KEYS)
        step = f"{run.get('last_step') if run.get('last_step') is not None else '-'}/{cfg.get('steps')}"
        rows.append(
            {
                "id": run["id"],
                "name": run["name"],
                "status": run["status"],
                "backbone": cfg.get("backbone"),
                "W": cfg.get("window"),
                "jagg_frac": cfg.get("jagg_frac"),
                "strategy": cfg.get("strategy"),
                "step": progress_line(run, last).removeprefix("step ")
                if run["status"] == "running"
                else step,
                "final reward": None if final is None else round(float(final), 4),
                "started": started_text(run),
                "duration": human_duration(training_duration(run, last)),
                "paired": run.get("paired_run_id"),
                "note": (notes or {}).get(run["id"], ""),
                "error": (run.get("error") or "").splitlines()[0] if run.get("error") else "",
            }
        )
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    frame["paired"] = frame["paired"].astype("Int64")  # run #10, never "10.0" next to an empty cell
    return frame


def progress(run: Mapping[str, Any]) -> tuple[int, int]:
    """(steps done, steps planned). Training steps are numbered from 1 (step 0 is the eval before
    training), so last_step is the number of steps done."""
    steps = int(run.get("config", {}).get("steps") or 0)
    last = run.get("last_step")
    done = 0 if last is None else min(steps, int(last))
    if run.get("status") == "finished":
        done = steps
    return done, steps


def progress_line(run: Mapping[str, Any], last: Mapping[str, tuple[int, float | None]] | None = None) -> str:
    """``step 9/14``, and for a running run with its training clock logged (``last``: :meth:`RunStore.last_values`
    of :data:`TRAINING_CLOCK_KEYS`) ``step 9/14 · 5.8 s/step · ETA 29 s`` (the steps left at the run's
    training seconds per step so far, :func:`seconds_per_step`)."""
    done, steps = progress(run)
    text = f"step {done}/{steps}"
    per_step = seconds_per_step(run, last) if run.get("status") == "running" else None
    if per_step is not None:
        text += f" · {per_step:.1f} s/step · ETA {human_duration(per_step * max(0, steps - done))}"
    return text


def update_time(frame: pd.DataFrame, skip_first: bool = True) -> float | None:
    """Median update-phase seconds per step (time/update, else forward + backward); the first step is left
    out when there are others (it pays one-off warm-up costs)."""
    if "time/update" in frame.columns:
        series = frame["time/update"]
    elif {"time/update_forward", "time/update_backward"} <= set(frame.columns):
        series = frame["time/update_forward"] + frame["time/update_backward"]
    else:
        return None
    series = series.dropna()
    if skip_first and len(series) > 1:
        series = series.iloc[1:]
    return None if series.empty else float(series.median())


def paired_exact_run(store: RunStore, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The exact-backward run paired with ``run`` (linked either way by paired_run_id), if any."""
    candidates = []
    if run.get("paired_run_id") is not None:
        other = store.get_run(run["paired_run_id"])
        if other is not None:
            candidates.append(other)
    candidates += [r for r in store.list_runs() if r.get("paired_run_id") == run["id"]]
    for other in candidates:
        if other["config"].get("strategy") == "exact" and other["id"] != run["id"]:
            return other
    return None


# What makes an exact run a fair baseline of a run it was not paired with: the same model, the same batch
# (prompts × group, sampling steps) and the same eval.
BASELINE_KEYS = (
    "backbone", "model_path", "prompts_per_step", "group_size", "sampling_steps",
    "eval_prompts_file", "eval_num_prompts", "eval_seeds", "eval_every",
)  # fmt: skip


def speedup_baseline(
    store: RunStore, run: Mapping[str, Any], selection: Sequence[Mapping[str, Any]] = ()
) -> tuple[dict[str, Any] | None, str]:
    """The exact run ``run``'s measured speedup is against, and why: its own paired exact run ("paired"),
    else the first exact run of ``selection`` with the same batch and eval (:data:`BASELINE_KEYS`; "same
    batch and eval"). (None, "") for an exact run or when no exact run fits: a run is never measured
    against an exact run of another batch size."""
    cfg = run["config"]
    if cfg.get("strategy") == "exact":
        return None, ""
    paired = paired_exact_run(store, run)
    if paired is not None:
        return paired, "paired"
    for other in selection:
        if other["id"] != run["id"] and other["config"].get("strategy") == "exact":
            if all(other["config"].get(k) == cfg.get(k) for k in BASELINE_KEYS):
                return dict(other), "same batch and eval"
    return None, ""


def provisional(*runs: Mapping[str, Any] | None) -> str:
    """ "" when every run has ended; else ``provisional: #4 running`` naming the runs still going (a measured
    speedup moves until both runs of the pair end)."""
    going = [
        f"#{r['id']} {r['status']}" for r in runs if r is not None and r["status"] in ("running", "queued")
    ]
    return f"provisional: {', '.join(going)}" if going else ""


# A measured speedup's state, beside it: whether the number is final (both runs ended) or still moves.
SPEEDUP_FINAL = "final: both runs ended"


def speedup_status(*runs: Mapping[str, Any] | None) -> str:
    """``provisional: #4 running`` while a run of the pair trains (:func:`provisional`), else
    :data:`SPEEDUP_FINAL`: the words of the "speedup status" column beside a measured speedup."""
    return provisional(*runs) or SPEEDUP_FINAL


def prediction_baseline(config: Mapping[str, Any], exact_config: Mapping[str, Any] | None) -> str:
    """What a predicted speedup (:func:`config_speedup`) is over, in the same words in the form, Live and
    Compare: exact backward over the run's own trained steps, or the exact run's own trained steps when it
    trains another number a step (Flow-GRPO's whole SDE range against a window)."""
    try:
        mine = trained_steps(config)
        theirs = trained_steps(exact_config) if exact_config is not None else mine
    except (KeyError, TypeError, ValueError):
        return ""
    if theirs == mine:
        return f"exact backward over the same {mine} trained steps"
    return f"exact backward over its {theirs} trained steps (this run trains {mine})"


def speedup_frame(store: RunStore, run_id: int, r: float) -> pd.DataFrame:
    """One-row table: update-phase seconds/step of this run and of its paired exact run, how the pair was
    timed (side-by-side or sequential, ``runs.pair_mode``), the measured speedup (exact / this; "provisional:
    #4 running" while either run still trains, :func:`provisional`) and the cost-model prediction for this
    run's W, jagg_frac and ``r``, with what it is over (:func:`prediction_baseline`)."""
    run = store.get_run(run_id)
    if run is None:
        return pd.DataFrame()
    cfg = run["config"]
    mine = update_time(store.metrics_frame(run_id))
    exact = paired_exact_run(store, run) if cfg.get("strategy") != "exact" else None
    exact_time = update_time(store.metrics_frame(exact["id"])) if exact else None
    measured = exact_time / mine if exact_time and mine else None
    predicted = config_speedup(cfg, r, exact["config"] if exact else None)
    return pd.DataFrame(
        [
            {
                "run": f"#{run_id} ({cfg.get('strategy')})",
                "update s/step": _round(mine),
                "paired exact run": f"#{exact['id']}" if exact else "-",
                "pair timed": (run.get("pair_mode") or "-") if exact else "-",  # side-by-side | sequential
                "exact update s/step": _round(exact_time),
                "measured speedup": _round(measured, 3),
                "speedup status": speedup_status(run, exact) if measured is not None else "-",
                "predicted speedup": _round(predicted, 3),
                "predicted over": prediction_baseline(cfg, exact["config"] if exact else None),
                "r": r,
            }
        ]
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def compare_frame(store: RunStore, run_ids: Iterable[int], r: float) -> pd.DataFrame:
    """Per run: final reward, training time (:func:`training_duration`), total and per-step update-phase
    time, the measured speedup over its own baseline (:func:`speedup_baseline`: its paired exact run, else an
    exact run picked with the same batch and eval, named in "exact run"; "provisional: …" while either
    still trains) and the cost-model prediction with what it is over."""
    runs = [run for run in (store.get_run(i) for i in run_ids) if run is not None]
    finals = {r_["id"]: r_.get("final_reward") for r_ in store.list_runs()}
    frames = {run["id"]: store.metrics_frame(run["id"]) for run in runs}
    rows = []
    for run in runs:
        cfg = run["config"]
        frame = frames[run["id"]]
        per_step = update_time(frame)
        total = float(frame["time/update"].sum()) if "time/update" in frame.columns else None
        exact, why = speedup_baseline(store, run, runs)
        if exact is not None and exact["id"] not in frames:
            frames[exact["id"]] = store.metrics_frame(exact["id"])
        exact_time = update_time(frames[exact["id"]]) if exact is not None else None
        measured = _round(exact_time / per_step, 3) if exact_time and per_step else None
        exact_cfg = exact["config"] if exact is not None else None
        rows.append(
            {
                "run": run_label(run),
                "final reward": _round(finals.get(run["id"])),
                "training time (s)": _round(
                    training_duration(run, store.last_values(run["id"], TRAINING_CLOCK_KEYS)), 1
                ),
                "update time (s)": _round(total, 2),
                "update s/step": _round(per_step),
                "speedup vs exact": measured,
                "exact run": f"#{exact['id']} ({why})" if exact is not None else "-",
                "speedup status": speedup_status(run, exact) if measured is not None else "-",
                "predicted": _round(config_speedup(cfg, r, exact_cfg), 3),
                "predicted over": prediction_baseline(cfg, exact_cfg)
                if cfg.get("strategy") != "exact"
                else "-",
            }
        )
    return pd.DataFrame(rows)


def config_diff(configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Fields whose values differ between runs (label → config dict): one row per field, one column per run."""
    labels = list(configs)
    keys = sorted({k for cfg in configs.values() for k in cfg})
    rows = []
    for key in keys:
        values = [configs[label].get(key) for label in labels]
        if any(v != values[0] for v in values[1:]):
            rows.append({"field": key, **{label: _show(v) for label, v in zip(labels, values)}})
    return pd.DataFrame(rows, columns=["field", *labels])


def _show(value: Any) -> str:
    return "null" if value is None else str(value)
