"""The app's report button: :func:`report_for_app` writes the picked runs' report (``jagg report``'s page,
:mod:`jagg_engine.report.page`) into the app's export folder and answers in one line."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jagg_engine.report.page import (  # noqa: F401 (the app's names for them)
    CSP,
    Progress,
    ReportError,
    _runs_section,
    _write,
    check_out,
    check_r,
    check_run_ids,
    image_data_uri,
    write_report,
)
from jagg_engine.store import RunStore, StoreError


def report_for_app(
    store: RunStore,
    run_ids: Sequence[int],
    folder: str | os.PathLike[str],
    r: float | None = None,
    progress: Progress | None = None,
) -> tuple[str, Path | None]:
    """The app's report button: write ``<folder>/jagg-report-<ids>.html`` (the folder is created; an older
    report of the same runs is replaced) and return (a one-line markdown message, the file), or (the
    message of what was wrong, None). Bad input never raises; errors name the field (runs, r)."""
    if not run_ids:
        return "Pick one or more runs.", None
    try:
        if not isinstance(run_ids, (list, tuple)):
            raise ReportError(f"runs: must be a list of run ids, got {run_ids!r}")
        ids = [_as_run_id(value) for value in run_ids]
        runs = check_run_ids(store, ids, field="runs")
        ratio = check_r(r, "r")
        name = "-".join(str(i) for i in ids)
        if len(name) > 80:  # a file name stays well under 255 bytes
            name = f"{len(ids)}-runs-{ids[0]}-to-{ids[-1]}"
        target = Path(folder) / f"jagg-report-{name}.html"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportError(
                f"report folder: cannot create {target.parent}: {exc.strerror or exc}"
            ) from None
        path = _write(store, runs, check_out(target), ratio, progress)
    except (ReportError, StoreError) as exc:
        return f"**Error:** {exc}", None
    size = path.stat().st_size / 1e6
    return f"Report of runs {', '.join(f'#{i}' for i in ids)} written: {path.name} ({size:.1f} MB).", path


def _as_run_id(value: Any) -> Any:
    """An app value (int from a dropdown, float from a number box, digits from the API) as an int run id;
    anything else is returned as it is, for :func:`check_run_ids` to refuse by name."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value
