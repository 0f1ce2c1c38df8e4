"""`jagg runs` (a table of the run history), `jagg export RUN_ID` (CSV + JSON of one run) and `jagg reindex`
(rebuild ``jagg.db`` from the run folders; it also removes the partial exports that a killed ``jagg export-model``
or app export left in the runs folder, its ``exports/`` or a run folder, each named in one line).

The first two read ``<runs_dir>/jagg.db`` (runs_dir default ``runs``) and never create it; a corrupt one is one
line naming it and ``jagg reindex``. jagg_engine/cli.py adds these subcommands with the ``add_*_arguments``
functions and dispatches to ``run_runs`` / ``run_export`` / ``run_reindex``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .store import DB_NAME, StoreError, missing_index_message, open_store, reindex, run_folders_with_files

COLUMNS = (
    "id",
    "name",
    "status",
    "backbone",
    "W",
    "jagg_frac",
    "strategy",
    "last step",
    "final reward",
    "duration",
)


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", default="runs", help="runs root holding jagg.db (default: runs)")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", type=int, metavar="RUN_ID", help="id shown by `jagg runs`")
    parser.add_argument("--runs-dir", default="runs", help="runs root holding jagg.db (default: runs)")
    parser.add_argument("--out", default=".", help="folder for the CSV and JSON files (default: .)")


def add_reindex_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs-dir", default="runs", help="runs root holding the run-NNNN folders (default: runs)"
    )


def run_reindex(args: argparse.Namespace) -> int:
    """Rebuild ``jagg.db`` from the run folders; the old index (if any) is kept beside it, renamed."""
    try:
        report = reindex(args.runs_dir)
    except (StoreError, OSError) as exc:
        print(f"jagg reindex: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    rows = sum(report.runs.values())
    print(f"reindexed {len(report.runs)} run(s), {rows} metric row(s) into {Path(args.runs_dir) / DB_NAME}")
    if report.previous is not None:
        print(f"the previous index is kept as {report.previous}")
    for line in report.rebuilt:
        print(f"WARNING: {line}")
    for line in report.skipped:
        print(f"skipped: {line}")
    for line in report.summary():
        print(f"skipped: {line}")
    for partial in remove_partial_exports(Path(args.runs_dir)):
        print(f"removed {partial}: the partial export of a process that is gone")
    return 0


def remove_partial_exports(runs_dir: Path) -> list[Path]:
    """The partial exports (``.NAME.partial-PID``) of processes that are gone, removed from the runs folder, its
    ``exports/`` (the app's zips), each run folder (where an export could be written before ``--out`` was
    refused there) and wherever a ``jagg export-model --out`` elsewhere wrote one (the notes it leaves in the
    runs folder: :func:`.export_format.remove_noted_partials`)."""
    from .export_format import remove_noted_partials, remove_stale_partials

    folders = [runs_dir, runs_dir / "exports"]
    folders += sorted(p for p in runs_dir.glob("run-*") if p.is_dir() and not p.is_symlink())
    return [path for folder in folders for path in remove_stale_partials(folder)] + remove_noted_partials(
        runs_dir
    )


def run_runs(args: argparse.Namespace) -> int:
    db = Path(args.runs_dir) / DB_NAME
    if not db.exists():
        if found := run_folders_with_files(Path(args.runs_dir)):
            print(f"jagg runs: error: {missing_index_message(Path(args.runs_dir), found)}", file=sys.stderr)
            return 2
        print(f"no runs yet ({db} does not exist)")
        return 0
    try:
        store = open_store(args.runs_dir)  # read-only where the folder cannot be written
    except StoreError as exc:
        print(f"jagg runs: error: {exc}", file=sys.stderr)
        return 2
    with store:
        store.check_liveness()
        runs = store.list_runs()
    if (Path(args.runs_dir).resolve().parent / "race.json").is_file():  # a race's runs: is its driver there?
        from jagg_engine.race.folder import check_runs_folder

        if line := check_runs_folder(args.runs_dir):
            print(line, file=sys.stderr)
    if not runs:
        print(f"no runs yet in {db}")
        return 0
    print(format_table([run_row(run) for run in runs]))
    return 0


def run_export(args: argparse.Namespace) -> int:
    db = Path(args.runs_dir) / DB_NAME
    if not db.exists():
        found = run_folders_with_files(Path(args.runs_dir))
        why = missing_index_message(Path(args.runs_dir), found) if found else f"no run database at {db}"
        print(f"jagg export: {'error: ' if found else ''}{why}", file=sys.stderr)
        return 2
    try:
        store = open_store(args.runs_dir)  # read-only where the folder cannot be written
    except StoreError as exc:
        print(f"jagg export: error: {exc}", file=sys.stderr)
        return 2
    with store:
        try:
            csv_path, json_path = store.export_run(args.run_id, args.out)
        except StoreError:
            print(f"jagg export: no run with id {args.run_id} in {db}", file=sys.stderr)
            return 2
        except OSError as exc:  # --out on a read-only or full filesystem
            print(f"jagg export: error: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(csv_path)
    print(json_path)
    return 0


def run_row(run: dict[str, Any], now: float | None = None) -> dict[str, str]:
    """One run (as from RunStore.list_runs) → the table's cells, as strings."""
    cfg = run["config"]
    started, finished = run["started_at"], run["finished_at"]
    if started is None:
        duration = ""
    else:
        end = finished if finished is not None else (now or time.time())
        duration = format_duration(end - started) + ("" if finished is not None else " …")
    reward = run.get("final_reward")
    reward_cell = "" if reward is None else f"{reward:.4f}"
    if reward is not None and (run.get("final_reward_key") or "").startswith("eval/"):
        reward_cell += " (eval)"
    return {
        "id": str(run["id"]),
        "name": run["name"],
        "status": run["status"]
        + (" (cancel requested)" if run["cancel_requested"] and run["status"] == "running" else ""),
        "backbone": str(cfg.get("backbone", "")),
        "W": str(cfg.get("window", "")),
        "jagg_frac": "" if cfg.get("jagg_frac") is None else f"{cfg['jagg_frac']:g}",
        "strategy": str(cfg.get("strategy", "")),
        "last step": "" if run["last_step"] is None else str(run["last_step"]),
        "final reward": reward_cell,
        "duration": duration,
    }


def format_table(rows: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines.append("  ".join("-" * widths[c] for c in COLUMNS))
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in rows]
    return "\n".join(lines)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
