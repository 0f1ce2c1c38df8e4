"""The shipped showcase: a recorded exact run (Flow-GRPO: the whole SDE range, exact backward) and a run of the
default (the windowed JAGG setting) of ``configs/tiny-shapes-cpu.yaml``, same seed, prompts and eval seeds,
so that the app shows a real comparison in its first second.

``assets/showcase/`` holds ``showcase.json`` (each run's row, config, every metric and probe, and its eval
samples), one PNG grid per run and eval step (the eval images, ``GRID_COLUMNS`` a row) and, for the JAGG run,
its aligned model as ``jagg export-model`` wrote it (``models/<key>/``: the tiny-shapes model folder with its
model card), so that the Try it tab can show it beside the base model. No checkpoint (optimizer and RNG
state), log or training sample is shipped. :func:`pack` writes it from a recorded runs folder
(``scripts/record_showcase.py`` records and packs); :func:`install` loads it into a runs folder as two
finished, paired runs whose images (and model: ``<run folder>/model/``, :func:`shipped_model`) live under
``<runs_dir>/showcase/``, once per runs folder (again when the showcase changes or its rows were deleted).
The app treats the installed ids as read-only.

No torch here (PIL cuts and joins the image grids).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from jagg_engine.export_format import ExportFormatError, read_export
from jagg_engine.store import RunStore, StoreError

SHOWCASE_DIR = Path(__file__).resolve().parents[1] / "assets" / "showcase"
MANIFEST = "showcase.json"
FORMAT = 1
GRID_COLUMNS = 18
INSTALL_DIR = "showcase"  # under the runs folder
MARKER = "installed.json"
RECORD_COMMAND = "python scripts/record_showcase.py"
MODELS = "models"  # under the showcase folder: one export folder per run key that ships its model
RUN_MODEL = "model"  # under an installed run's folder: its shipped model


def shipped_model(run_dir: str | os.PathLike[str] | None) -> tuple[int, Path] | None:
    """The model an installed showcase run ships (``<run_dir>/model/``, an export of ``jagg export-model``):
    (its training step, the folder), or None when the run folder holds none (or none that reads as an
    export)."""
    if not run_dir:
        return None
    folder = Path(run_dir) / RUN_MODEL
    try:
        return int(read_export(folder)["step"]), folder
    except (ExportFormatError, TypeError, ValueError):
        return None


def pack(
    store: RunStore,
    runs: Mapping[str, int],
    out_dir: str | os.PathLike[str],
    recorded_with: str = RECORD_COMMAND,
    max_step: int | None = None,
    image_every: int | None = None,
    models: Mapping[str, str | os.PathLike[str]] | None = None,
) -> Path:
    """Write the showcase of ``runs`` (key such as "exact" → run id of ``store``) into ``out_dir``: the
    manifest and the eval-image grids. Replaces what ``out_dir`` held. Returns the manifest path.

    ``max_step`` keeps a run's history up to that step (a longer run's first steps are those of a run that
    stops there: the config's ``steps`` says so, ``finished_at`` is the step's ``time/unix``, and the entry
    keeps ``cut_at_step``). ``image_every`` ships the eval images of every k-th step only (plus the first and
    the last eval), so that a long run fits the Space's size; every eval metric is kept. Each run is named
    ``showcase-<key>`` (its name when recorded kept as ``recorded_as``).

    ``models`` (key → an export folder of that run, ``jagg export-model``) ships the run's aligned model: the
    folder is copied to ``models/<key>/``; it must be an export of that run at a step the shipped history
    holds (ValueError otherwise)."""
    models = dict(models or {})
    unknown = sorted(set(models) - set(runs))
    if unknown:
        raise ValueError(f"models: {', '.join(unknown)} is not a key of runs ({', '.join(runs)})")
    if max_step is not None and max_step < 0:
        raise ValueError(f"max_step: must be >= 0, got {max_step}")
    if image_every is not None and image_every < 1:
        raise ValueError(f"image_every: must be >= 1, got {image_every}")
    last = math.inf if max_step is None else max_step
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    entries = []
    for key, run_id in runs.items():
        run = store.get_run(run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}")
        if run["status"] != "finished":
            raise StoreError(f"run {run_id}: is {run['status']}; only a finished run is a showcase")
        name = f"showcase-{key}"  # the name the app, its tests and reports know it by
        config = {**run["config"], "output_dir": "runs", "name": name}
        metrics = [
            [int(step), key_, value]
            for step, key_, value in store.db.execute(
                "SELECT step, key, value FROM metrics WHERE run_id = ? ORDER BY step, key", [run_id]
            ).fetchall()
            if step <= last
        ]
        probes = [
            {k: v for k, v in p.items() if k != "run_id"} for p in store.probes(run_id) if p["step"] <= last
        ]
        finished_at = run["finished_at"]
        cut = max_step is not None and int(config.get("steps") or 0) > max_step
        if cut:
            config["steps"] = max_step
            clock = [value for step, key_, value in metrics if step == max_step and key_ == "time/unix"]
            finished_at = clock[0] if clock else finished_at
        samples = []
        by_step: dict[int, list[dict[str, Any]]] = {}
        for s in store.samples(run_id, "eval"):
            if s["step"] <= last:
                by_step.setdefault(int(s["step"]), []).append(s)
        eval_steps = sorted(by_step)
        for step, rows in sorted(by_step.items()):
            if image_every and step % image_every and step not in (eval_steps[0], eval_steps[-1]):
                continue
            grid_name = f"{key}-eval-{step:05d}.png"
            images = [Image.open(Path(run["run_dir"]) / s["path"]).convert("RGB") for s in rows]
            width, height = images[0].size
            if any(img.size != (width, height) for img in images):
                raise ValueError(f"run {run_id} step {step}: eval images differ in size")
            cols = min(GRID_COLUMNS, len(images))
            grid = Image.new("RGB", (cols * width, math.ceil(len(images) / cols) * height))
            for cell, (s, img) in enumerate(zip(rows, images)):
                grid.paste(img, ((cell % cols) * width, (cell // cols) * height))
                samples.append(
                    {
                        "step": step,
                        "path": s["path"],
                        "prompt": s["prompt"],
                        "seed": s["seed"],
                        "reward": s["reward"],
                        "grid": grid_name,
                        "cell": cell,
                    }
                )
            grid.save(out / "images" / grid_name, optimize=True)
        model = _pack_model(run, key, models[key], out, last) if key in models else None
        entries.append(
            {
                "key": key,
                "name": name,
                **({"recorded_as": run["name"]} if run["name"] != name else {}),
                "config": config,
                "created_at": run["created_at"],
                "started_at": run["started_at"],
                "finished_at": finished_at,
                "cell_size": [width, height] if samples else None,
                "metrics": metrics,
                "probes": probes,
                "samples": samples,
                **({"cut_at_step": max_step} if cut else {}),
                **({"model": model} if model else {}),
            }
        )
    manifest = {
        "format": FORMAT,
        "recorded_with": recorded_with,
        "grid_columns": GRID_COLUMNS,
        "runs": entries,
    }
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def _pack_model(
    run: Mapping[str, Any], key: str, source: str | os.PathLike[str], out: Path, last: float
) -> dict:
    """Copy run ``run``'s export ``source`` to ``out/models/<key>/``; the manifest's entry for it (its step, the
    folder and a sha256 over its files, so that a new model is a new showcase)."""
    try:
        info = read_export(source)
    except ExportFormatError as exc:
        raise ValueError(f"models: {key}: {exc}") from None
    uid = (info.get("run") or {}).get("uid")
    if uid != run.get("uid"):
        raise ValueError(
            f"models: {key}: {source} is an export of run {uid}, not of run {run['id']} ({run.get('uid')})"
        )
    step = int(info["step"])
    if step > last:
        raise ValueError(f"models: {key}: the export is of step {step}, past the shipped steps (0-{last})")
    target = out / MODELS / key
    shutil.copytree(source, target)
    digest = hashlib.sha256()
    for file in sorted(p for p in target.rglob("*") if p.is_file()):
        digest.update(file.relative_to(target).as_posix().encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return {"dir": f"{MODELS}/{key}", "step": step, "sha256": digest.hexdigest()}


def install(
    store: RunStore, runs_dir: str | os.PathLike[str], showcase_dir: str | os.PathLike[str] = SHOWCASE_DIR
) -> list[int]:
    """Make the showcase runs part of this runs folder's history; returns their ids (exact first).

    Idempotent: a folder that already holds this showcase (``<runs_dir>/showcase/installed.json`` names
    ids whose rows still exist, each a finished run in ``<runs_dir>/showcase/`` with the uid the record names)
    is left as it is; a record naming any other run (a user's run that took a freed id) is not believed. A missing showcase gives []. An error while loading rolls
    back what was loaded and is printed; the app starts without the showcase.
    """
    manifest_path = Path(showcase_dir) / MANIFEST
    if not manifest_path.is_file():
        return []
    raw = manifest_path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()[:16]
    root = Path(runs_dir).resolve()
    folder = root / INSTALL_DIR
    marker = folder / MARKER
    previous: dict[str, Any] = {}
    try:
        previous = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        pass
    ids = [int(i) for i in previous.get("ids", []) if isinstance(i, int)]
    uids = previous.get("uids") or []
    # A row is the installed showcase run only when it lives in the showcase folder (and carries the uid the
    # record names): an id alone could be a user's run that took a freed number.
    present = [_installed_run(store, i, folder) for i in ids]
    if (
        previous.get("digest") == digest
        and ids
        and all(r is not None and r["status"] == "finished" and r["last_step"] is not None for r in present)
        and (not uids or [r["uid"] for r in present] == uids)  # a record of an older version names no uids
    ):
        return ids
    if getattr(store, "read_only", False):  # a read-only history is shown as it is
        print("jagg app: the runs folder is read-only; the showcase is not loaded into it", flush=True)
        return []
    # An older showcase, one half deleted, or rows the record lost: every row of the showcase folder goes
    # (a user's run is never touched), then the folder.
    for run in store.list_runs():
        if _installed_run(store, run["id"], folder) is not None:
            store.delete_run(run["id"])
    shutil.rmtree(folder, ignore_errors=True)
    manifest = json.loads(raw)
    created: list[int] = []
    try:
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT}")
        for entry in manifest["runs"]:
            created.append(_load_run(store, folder, Path(showcase_dir), entry))
        if len(created) == 2:
            store.set_paired(created[1], created[0])
            store.set_paired(created[0], created[1])
        folder.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_suffix(".tmp")
        record = {"digest": digest, "ids": created, "uids": [store.uid(i) for i in created]}
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, marker)
    except (OSError, ValueError, KeyError, StoreError, sqlite3.Error) as exc:
        for run_id in created:
            try:
                store.delete_run(run_id)
            except StoreError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
        print(f"jagg app: the showcase was not loaded: {exc}", flush=True)
        return []
    return created


def _installed_run(store: RunStore, run_id: int, folder: Path) -> dict[str, Any] | None:
    """Run ``run_id``'s row when its folder lies in the installed showcase's ``folder``, else None."""
    run = store.get_run(run_id)
    run_dir = (run or {}).get("run_dir")
    if not run_dir or not Path(run_dir).resolve().is_relative_to(folder):
        return None
    return run


def _load_run(store: RunStore, folder: Path, showcase_dir: Path, entry: Mapping[str, Any]) -> int:
    run_dir = folder / str(entry["key"])
    run_dir.mkdir(parents=True, exist_ok=True)  # first: its run.json and history.jsonl hold every row
    run_id = store.create_run(str(entry["name"]), entry["config"], run_dir)
    store.set_status(run_id, "running")
    by_step: dict[int, dict[str, Any]] = {}
    for step, key, value in entry["metrics"]:
        by_step.setdefault(int(step), {})[key] = math.nan if value is None else value
    for step, metrics in sorted(by_step.items()):
        store.log_step(run_id, step, metrics)
    probes_by_step: dict[int, list[dict[str, Any]]] = {}
    for p in entry.get("probes", []):
        probes_by_step.setdefault(int(p["step"]), []).append(p)
    for step, probes in sorted(probes_by_step.items()):
        store.log_probes(run_id, step, probes)
    _write_images(run_dir, showcase_dir, entry)
    model = entry.get("model")
    if model:  # the shipped aligned model (the Try it tab's)
        source = showcase_dir / MODELS / Path(str(model["dir"])).name
        if not source.is_dir():
            raise ValueError(f"{source}: the shipped model is missing")
        shutil.copytree(source, run_dir / RUN_MODEL)
    samples_by_step: dict[int, list[dict[str, Any]]] = {}
    for s in entry["samples"]:
        samples_by_step.setdefault(int(s["step"]), []).append({**s, "kind": "eval"})
    for step, samples in sorted(samples_by_step.items()):
        store.log_samples(run_id, step, samples)
    store.set_status(run_id, "finished")
    store.set_times(run_id, entry["created_at"], entry["started_at"], entry["finished_at"])
    return run_id


def _write_images(run_dir: Path, showcase_dir: Path, entry: Mapping[str, Any]) -> None:
    """Cut each eval grid back into the run's own image files (pixel for pixel: PNG is lossless)."""
    if not entry["samples"]:
        return
    width, height = entry["cell_size"]
    grids: dict[str, Image.Image] = {}
    for s in entry["samples"]:
        rel = Path(s["path"])
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"sample path {s['path']!r} is not inside the run folder")
        grid = grids.get(s["grid"])
        if grid is None:
            grid = grids[s["grid"]] = Image.open(showcase_dir / "images" / Path(s["grid"]).name).convert(
                "RGB"
            )
        cols = grid.width // width
        x, y = (s["cell"] % cols) * width, (s["cell"] // cols) * height
        target = run_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        grid.crop((x, y, x + width, y + height)).save(target)


# ---------------------------------------------------------------------------------------------- the first screen


def _labelled(store: RunStore, ids: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    runs = [run for run in (store.get_run(i) for i in ids) if run is not None]
    labels = {f"#{run['id']} {run['config'].get('strategy')}": run for run in runs}
    return {label: store.metrics_frame(run["id"]) for label, run in labels.items()}, labels


def headline(store: RunStore, ids: list[int], r: float) -> str:
    """One sentence over the showcase's runs (exact first): the reward level
    (:func:`app.metrics.default_level`), each run's training seconds (evals excluded, the curves' x axis:
    :data:`SHOWCASE_X`) to reach it, how much sooner the JAGG run gets there, and its measured update-phase
    speedup over its paired exact run. "" when a run or an eval is missing."""
    from app import data, metrics

    frames, runs = _labelled(store, ids)
    found = metrics.default_level(frames) if len(frames) == 2 else None
    if found is None:
        return ""
    level, whose = found
    (exact_label, jagg_label) = sorted(
        frames, key=lambda label: runs[label]["config"].get("strategy") != "exact"
    )
    reach = {label: metrics.first_reach(frames[label], level) for label in frames}
    if any(hit is None or not math.isfinite(hit[1]) for hit in reach.values()):
        return ""
    (exact_step, exact_s), (jagg_step, jagg_s) = reach[exact_label], reach[jagg_label]
    sooner = f" — **{exact_s / jagg_s:.1f}× sooner**" if jagg_s > 0 else ""
    table = data.speedup_frame(store, runs[jagg_label]["id"], r)
    measured = table.iloc[0].get("measured speedup") if len(table) else None
    speedup = (
        f"; its update phase is **{float(measured):.2f}× faster** than its paired exact run's (measured)"
        if measured is not None and measured == measured
        else ""
    )
    return (
        f"To reach eval reward **{level:.3f}** ({whose}), {jagg_label} trains "
        f"**{jagg_s:.0f} s** (step {jagg_step}) and {exact_label} **{exact_s:.0f} s** (step {exact_step}), "
        f"evals excluded as on the curves' training-time axis{sooner}{speedup}."
    )


SHOWCASE_X = "training time"  # the showcase's x axis: the clock of its sentence (evals excluded)


def curves_over_time(store: RunStore, ids: list[int]) -> str:
    """The static reward curves of the first screen (:func:`app.data.reward_svg`) against each run's training
    seconds (evals excluded, :data:`SHOWCASE_X`: the time of :func:`headline`'s sentence), so that the time a
    run saves shows at the first paint, and where the sentence says."""
    from app import data, metrics

    frames, runs = _labelled(store, ids)
    timed = {}
    for label, frame in frames.items():
        seconds = metrics.x_values(frame, runs[label], SHOWCASE_X)
        timed[label] = frame.assign(step=seconds).dropna(subset=["step"])
    return data.reward_svg(timed, x_title=metrics.axis_title(SHOWCASE_X))
