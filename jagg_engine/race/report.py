"""A race's report rebuilt from its runs: race.json (the plan with the results), race.svg and race.md."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jagg_engine.errors import UsageError
from jagg_engine.store import open_store

from .figure import race_svg
from .folder import _read_plan, _write_atomic, race_state
from .plan import RACE_JSON, RACE_MD, RACE_SVG, RaceError
from .summary import Curve, eval_curve, markdown_table, summarise

_THREADS_LOG = re.compile(r"torch CPU threads: (\d+)")


def report(
    out: Path, plan: dict[str, Any] | None = None, baseline: str | None = None
) -> tuple[dict[str, Any], list[Path]]:
    """Rebuild the race's figures from its store (``out/runs/jagg.db``) and plan (``out/race.json``): write
    race.json (the plan with the results), race.svg and race.md; return the summary and the files written.
    Only finished runs count. ``baseline``: another variant as the baseline, written to race-vs-NAME.json
    (the summary), .svg and .md beside the race's own files, which stay as they are.

    A race that has not finished every planned run (interrupted, failed, still running) is reported as far
    as it got: the summary's ``partial`` says so in one line (also atop the table and the figure); a race
    still running (its driver holds the folder) is reported but nothing is written, so its driver's
    race.json stays the only writer's."""
    plan = plan if plan is not None else _read_plan(out)
    names = [v["name"] for v in plan["variants"]]
    if baseline is not None and baseline not in names:
        raise UsageError(f"--baseline: {baseline!r} is not a variant of this race; one of {', '.join(names)}")
    store = open_store(out / "runs")
    try:
        curves: dict[str, dict[int, Curve]] = {name: {} for name in names}
        for entry in plan["runs"]:
            run = store.get_run(entry["run_id"])
            if run is None:
                raise RaceError(f"run {entry['run_id']}: not in {store.path}")
            entry["status"] = run["status"]
            entry["threads_logged"] = _threads_logged(run)
            frame = store.metrics_frame(run["id"])
            entry["trained_from_unix"], entry["trained_to_unix"] = _trained_span(frame)
            if run["status"] == "finished":
                try:
                    curves[entry["variant"]][entry["seed"]] = eval_curve(frame)
                except RaceError as exc:
                    raise RaceError(
                        f"run {run['id']} ({entry['variant']}, seed {entry['seed']}): {exc}"
                    ) from None
    finally:
        store.close()
    status, unfinished = race_state(plan)
    against = baseline if baseline is not None else names[0]
    try:
        summary = summarise(curves, against)
    except RaceError as exc:
        raise RaceError(f"{unfinished}; {exc}" if unfinished else str(exc)) from None
    summary["partial"] = f"{unfinished}; this report covers only them (partial)" if unfinished else None
    if status == "running":  # its driver is alive and writes race.json: report, write nothing
        return summary, []
    if against != names[0]:
        stem = f"race-vs-{baseline}"
        files = [out / f"{stem}.json", out / f"{stem}.svg", out / f"{stem}.md"]
        _write_atomic(files[0], json.dumps({"command": plan["command"], "summary": summary}, indent=1))
    else:
        plan["heats"] = _heats(plan)
        plan["summary"] = summary
        files = [out / RACE_JSON, out / RACE_SVG, out / RACE_MD]
        _write_atomic(files[0], json.dumps(plan, indent=1))
    _write_atomic(files[1], race_svg(summary))
    _write_atomic(files[2], f"```bash\n{plan['command']}\n```\n\n{markdown_table(summary)}")
    return summary, files


def _threads_logged(run: Mapping[str, Any]) -> int | None:
    """The torch CPU threads the trainer reported in its train.log (the last start, after a resume)."""
    try:
        found = _THREADS_LOG.findall((Path(run["run_dir"]) / "train.log").read_text(errors="replace"))
    except (OSError, TypeError):
        return None
    return int(found[-1]) if found else None


def _trained_span(frame: Any) -> tuple[float | None, float | None]:
    """Unix times at which a run's training started (its first step's end less its training time) and ended."""
    if frame.empty or "time/unix" not in frame:
        return None, None
    rows = frame[frame["time/unix"].notna() & frame["time/train_elapsed"].notna()]
    if rows.empty:
        return None, None
    first = rows.iloc[0]
    return float(first["time/unix"] - first["time/train_elapsed"]), float(rows["time/unix"].iloc[-1])


def _heats(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per seed, how long its runs trained together (side by side: all of them at once)."""
    heats = []
    for seed in plan["seeds"]:
        spans = [(e["trained_from_unix"], e["trained_to_unix"]) for e in plan["runs"] if e["seed"] == seed]
        if not spans or any(a is None or b is None for a, b in spans):
            continue
        heats.append(
            {
                "seed": seed,
                "all_training_together_s": max(0.0, min(b for _, b in spans) - max(a for a, _ in spans)),
                "first_start_to_last_end_s": max(b for _, b in spans) - min(a for a, _ in spans),
            }
        )
    return heats
