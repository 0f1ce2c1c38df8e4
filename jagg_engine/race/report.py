"""A race's report rebuilt from its runs: race.json (the plan with the results), race.svg and race.md.

The runs are read from the race's store (``DIR/runs/jagg.db``) or, where that is gone (a race committed to a
repository, whose ``runs/`` holds checkpoints and images and is left out), from ``DIR/history/``: each run's
``run.json`` and its ``history.jsonl`` gzipped, which every report written from the store saves
(:func:`save_history`) and from which the runs' index is rebuilt (:func:`jagg_engine.store.reindex`) into a
temporary folder. Both give the same report, figure for figure."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jagg_engine.errors import UsageError
from jagg_engine.store import DB_NAME, HISTORY_FILE, RUN_FILE, RunStore, open_store, reindex

from .figure import race_svg
from .folder import _read_plan, _write_atomic, race_state
from .plan import HISTORY_DIR, RACE_JSON, RACE_MD, RACE_SVG, RaceError
from .summary import Curve, batch_spread, eval_curve, markdown_table, summarise

_THREADS_LOG = re.compile(r"torch CPU threads: (\d+)")


def report(
    out: Path, plan: dict[str, Any] | None = None, baseline: str | None = None
) -> tuple[dict[str, Any], list[Path]]:
    """Rebuild the race's figures from its runs (:func:`race_store`) and plan (``out/race.json``): write
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
    with race_store(out) as (store, live):
        curves: dict[str, dict[int, Curve]] = {name: {} for name in names}
        spreads: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in names}
        for entry in plan["runs"]:
            run = store.get_run(entry["run_id"])
            if run is None:
                raise RaceError(f"run {entry['run_id']}: not in {store.path}")
            entry["status"] = run["status"]
            logged = _threads_logged(run)  # None without the train.log (a report from history/): kept
            entry["threads_logged"] = logged if logged is not None else entry.get("threads_logged")
            frame = store.metrics_frame(run["id"])
            entry["trained_from_unix"], entry["trained_to_unix"] = _trained_span(frame)
            if run["status"] == "finished":
                try:
                    curves[entry["variant"]][entry["seed"]] = eval_curve(frame)
                    spread = batch_spread(frame)
                    if spread is not None:
                        spreads[entry["variant"]][entry["seed"]] = spread
                except RaceError as exc:
                    raise RaceError(
                        f"run {run['id']} ({entry['variant']}, seed {entry['seed']}): {exc}"
                    ) from None
        status, unfinished = race_state(plan)
        if status != "running" and live:
            save_history(out, store, plan)
    against = baseline if baseline is not None else names[0]
    try:
        summary = summarise(curves, against, spreads)
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


@contextlib.contextmanager
def race_store(out: Path) -> Iterator[tuple[RunStore, bool]]:
    """The race's runs: (its store ``out/runs/jagg.db``, True), else (an index rebuilt from ``out/history/``
    in a temporary folder, False). UsageError when it has neither."""
    if (out / "runs" / DB_NAME).is_file():
        store = open_store(out / "runs")
        try:
            yield store, True
        finally:
            store.close()
        return
    if not (out / HISTORY_DIR).is_dir():
        raise UsageError(f"--out: {out} holds no race runs (runs/{DB_NAME} or {HISTORY_DIR}/)")
    with tempfile.TemporaryDirectory(prefix="jagg-race-history-") as tmp:
        root = Path(tmp) / "runs"
        for folder in sorted(p for p in (out / HISTORY_DIR).iterdir() if p.is_dir()):
            (root / folder.name).mkdir(parents=True)
            shutil.copyfile(folder / RUN_FILE, root / folder.name / RUN_FILE)
            with gzip.open(folder / f"{HISTORY_FILE}.gz", "rb") as src:
                (root / folder.name / HISTORY_FILE).write_bytes(src.read())
        rebuilt = reindex(root)
        if rebuilt.skipped or rebuilt.lines:
            raise RaceError(f"{out / HISTORY_DIR}: " + "; ".join(rebuilt.skipped + rebuilt.summary()))
        store = open_store(root, read_only=True)
        try:
            yield store, False
        finally:
            store.close()


def save_history(out: Path, store: RunStore, plan: Mapping[str, Any]) -> Path:
    """Keep what a report needs beside it: ``out/history/run-NNNN/`` with each planned run's ``run.json``
    and its ``history.jsonl`` gzipped (no checkpoint, image or log), so that ``--report-only`` rebuilds the
    report from them where ``runs/`` is gone. Written beside and renamed in; the gzip stream carries no time,
    so an unchanged run gives the same bytes."""
    dest = out / HISTORY_DIR
    building = out / f".{HISTORY_DIR}.{os.getpid()}.tmp"
    shutil.rmtree(building, ignore_errors=True)
    try:
        for entry in plan["runs"]:
            run = store.get_run(entry["run_id"])
            folder = Path(run["run_dir"]) if run and run["run_dir"] else None
            if folder is None or not (folder / RUN_FILE).is_file():
                continue
            target = building / folder.name
            target.mkdir(parents=True)
            shutil.copyfile(folder / RUN_FILE, target / RUN_FILE)
            with open(folder / HISTORY_FILE, "rb") as src, open(target / f"{HISTORY_FILE}.gz", "wb") as raw:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
                    shutil.copyfileobj(src, packed)
        if not building.exists():  # no run has a folder yet: nothing to keep
            return dest
        old = out / f".{HISTORY_DIR}.{os.getpid()}.old"
        if dest.exists():
            os.replace(dest, old)
        os.replace(building, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return dest


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
