"""One self-contained HTML report of one or more runs, to share or archive without a server.

``write_report(store, run_ids, out)`` writes ONE file that opens offline in any browser: the runs' summary
(with their notes, written in the app's History), their config (and, for several runs, the fields that
differ), the reward curves, the speedup table, the step-time breakdown of each run, and the eval images of
the same prompts and seeds at each run's own first and last eval step. Every table and figure is the one the
app shows (:mod:`.tables`, :mod:`.figures`, :mod:`.images`).

Offline by construction: plotly.js (its basic partial bundle, assets/plotly) is inlined once, images are ``data:`` URIs, no font, no MathJax, and a
Content-Security-Policy meta (``default-src 'none'``, images only from ``data:``) stops the page from
fetching anything even if something in it tried. The file is written to a temporary name beside ``out``
and renamed, so a failed write (bad folder, full disk) leaves no half-written report and keeps an older one.

Used by `jagg report RUN [RUN ...] --out FILE.html` (:func:`add_arguments`, :func:`run`) and by the app's
report button (:func:`app.report.report_for_app`). No torch here.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from jagg_engine.processes import gpu_present
from jagg_engine.store import DB_NAME, RunStore, StoreError, open_store
from jagg_engine.store.notes import read_notes

from . import figures, images, tables

RUN_ID_MAX = 2**63 - 1
IMAGE_ROWS = 12  # prompt+seed rows of eval images (spread evenly over those every run has)
IMAGE_MAX_SIDE = 512  # larger images are scaled down (JPEG) so that a report of big models stays shareable
REPORT_SUFFIXES = (".html", ".htm")
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}
Progress = Callable[[str], None]


class ReportError(ValueError):
    """A request the report refuses; the message is one line that names the field."""


# ---------------------------------------------------------------------------------------------- checks


def check_run_ids(store: RunStore, run_ids: Iterable[Any], field: str = "RUN") -> list[dict[str, Any]]:
    """The run rows of ``run_ids``, in the order given; raises ReportError naming ``field`` for an empty list,
    a value that is not a run id, an id given twice or one the store does not hold."""
    ids: list[int] = []
    for value in run_ids:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= RUN_ID_MAX:
            raise ReportError(f"{field}: must be whole numbers from 1 to {RUN_ID_MAX}, got {value!r}")
        if value in ids:
            raise ReportError(f"{field}: run {value} is given twice")
        ids.append(value)
    if not ids:
        raise ReportError(f"{field}: give one or more run ids")
    runs = []
    for run_id in ids:
        run = store.get_run(run_id)
        if run is None:
            raise ReportError(f"{field}: no run with id {run_id} in {store.path}")
        runs.append(run)
    return runs


def check_out(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path if a report can be written there: a name ending in .html (or .htm), not a folder, in
    an existing folder that takes a new file (tried by creating and removing one). Raises ReportError
    naming ``--out`` otherwise; writes nothing."""
    path = Path(out).expanduser()
    if path.suffix.lower() not in REPORT_SUFFIXES:
        raise ReportError(f"--out: must be a file name ending in .html, got {str(out)!r}")
    if path.is_dir():
        raise ReportError(f"--out: {path} is a folder; give a file name such as {path / 'report.html'}")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ReportError(f"--out: folder {folder} {what}")
    probe = _tmp_name(path)
    try:
        with open(probe, "x"):
            pass
        probe.unlink()
    except OSError as exc:
        raise ReportError(f"--out: cannot write to {folder}: {exc.strerror or exc}") from None
    return path


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


# ---------------------------------------------------------------------------------------------- writing


def write_report(
    store: RunStore,
    run_ids: Sequence[int],
    out: str | os.PathLike[str],
    r: float | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write the report of ``run_ids`` to ``out`` (an .html file) and return its path.

    ``r`` is the cost ratio of the speedup prediction (forward+backward / forward; default
    :func:`default_report_r`). ``progress`` receives a line per phase. Raises ReportError (a bad run id, r
    or ``out``, a folder that refuses the write); nothing is left behind then, and a file already at
    ``out`` is kept as it was.
    """
    path = check_out(out)
    runs = check_run_ids(store, run_ids)
    return _write(store, runs, path, check_r(r, "--r"), progress)


def check_r(r: Any, field: str = "r") -> float:
    """The cost ratio r (None = :func:`default_report_r`); a finite number > 0, else ReportError."""
    if r is None:
        return default_report_r()
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and r > 0):
        raise ReportError(f"{field}: must be a finite number > 0, got {r!r}")
    return float(r)


def _write(
    store: RunStore, runs: Sequence[Mapping[str, Any]], path: Path, r: float, progress: Progress | None
) -> Path:
    page = render_report(store, runs, r, progress)
    if progress is not None:
        progress(f"writing {path} ({len(page) / 1e6:.1f} MB)")
    _write_atomic(path, page)
    return path


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``."""
    tmp = _tmp_name(path)
    try:
        with open(tmp, "x", encoding="utf-8") as fh:  # the umask's mode, as any file the user writes
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"--out: cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:  # an interrupt: no temporary file left behind either
        tmp.unlink(missing_ok=True)
        raise


def default_report_r() -> float:
    """The app's default r: 3 where an NVIDIA driver is present, 1.8 (measured on the CPU) otherwise."""
    return tables.default_r(gpu_present())  # an NVIDIA driver, seen without initialising CUDA


# ---------------------------------------------------------------------------------------------- rendering


def render_report(
    store: RunStore, runs: Sequence[Mapping[str, Any]], r: float, progress: Progress | None = None
) -> str:
    """The report's HTML text for run rows already checked (see :func:`check_run_ids`)."""
    say = progress or (lambda _line: None)
    ids = [int(run["id"]) for run in runs]
    labels = {run["id"]: f"#{run['id']} {run['config'].get('strategy')}" for run in runs}
    say(f"reading {len(runs)} run{'s' if len(runs) > 1 else ''}: " + ", ".join(f"#{i}" for i in ids))
    frames = {run["id"]: store.metrics_frame(run["id"]) for run in runs}
    plots = _Plots()
    sections = [
        ("runs", "Runs", _runs_section(store, ids)),
        ("config", "Config", _config_section(runs)),
        ("reward", "Reward", _reward_section(plots, {labels[i]: frames[i] for i in ids})),
        ("speedup", "Speedup", _speedup_section(store, runs, r)),
        ("step-time", "Step time", _time_section(plots, runs, frames)),
    ]
    say("encoding the eval images")
    sections.append(
        ("images", "Eval images, each run's own first and last eval step", _images_section(store, runs))
    )
    title = "JAGG Studio report: " + ", ".join(f"#{run['id']} {run['name']}" for run in runs)
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    nav = " · ".join(f'<a href="#{key}">{html.escape(name)}</a>' for key, name, _ in sections)
    body = "\n".join(
        f'<section id="{key}"><h2>{html.escape(name)}</h2>\n{content}\n</section>'
        for key, name, content in sections
    )
    return _PAGE.format(
        csp=CSP,
        title=html.escape(title),
        style=_STYLE,
        meta=html.escape(
            f"Written {written} from {store.runs_root.name}/{store.path.name} · cost-model r = {r:g}"
        ),
        nav=nav,
        body=body,
    )


PLOTLY_JS = Path(__file__).resolve().parents[2] / "assets" / "plotly" / "plotly-basic.min.js"
# plotly.js's "basic" partial bundle (scatter, bar, pie; MIT, assets/plotly/LICENSE), the version plotly.py
# draws with: a report holds only scatter and bar traces, and the full bundle (maps, 3-D, …) is 4× larger.


def plotly_script() -> str:
    """The inline ``<script>`` of plotly.js's basic bundle (``</script>`` cannot occur in it: checked)."""
    text = PLOTLY_JS.read_text(encoding="utf-8")
    if "</script" in text.lower():
        raise ReportError(f"{PLOTLY_JS}: holds a closing script tag; cannot be inlined")
    return f'<script type="text/javascript">{text}</script>'


class _Plots:
    """Plotly figures as HTML divs; the first one carries plotly.js (the basic bundle inlined, once per
    page, never a CDN)."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, fig: go.Figure, name: str) -> str:
        self.count += 1
        div = pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            include_mathjax=False,
            div_id=f"plot-{name}",
            default_height=f"{fig.layout.height or 360}px",
            config={"displaylogo": False, "responsive": True},
        )
        return (plotly_script() if self.count == 1 else "") + div


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return '<p class="note">no data</p>'
    shown = frame.astype(object).where(frame.notna(), "–")  # None and NaN alike
    return shown.to_html(index=False, border=0, escape=True)


def _runs_section(store: RunStore, ids: Sequence[int]) -> str:
    """The runs' rows of History's table, their notes (History's, ``notes.json``) included; the note and
    error columns only where a run has one."""
    frame = tables.history_frame(store, read_notes(store.runs_root))
    frame = frame[frame["id"].isin(ids)].set_index("id").loc[list(ids)].reset_index()
    empty = [column for column in ("note", "error") if not frame[column].any()]
    return _table(frame.drop(columns=empty))


def _config_section(runs: Sequence[Mapping[str, Any]]) -> str:
    configs = {f"#{run['id']}": run["config"] for run in runs}
    parts = []
    if len(runs) > 1:
        diff = tables.config_diff(configs)
        parts.append("<h3>Fields that differ</h3>")
        parts.append(_table(diff) if not diff.empty else '<p class="note">the configs are identical</p>')
    keys = sorted({k for cfg in configs.values() for k in cfg})
    full = pd.DataFrame(
        [{"field": k, **{label: tables._show(cfg.get(k)) for label, cfg in configs.items()}} for k in keys],
        columns=["field", *configs],
    )
    summary = "Full config" + ("s" if len(runs) > 1 else "")
    parts.append(
        f"<details{' open' if len(runs) == 1 else ''}><summary>{summary}</summary>{_table(full)}</details>"
    )
    return "\n".join(parts)


def _reward_section(plots: _Plots, frames: Mapping[str, pd.DataFrame]) -> str:
    fig = figures.reward_figure(
        frames, title="Reward per step (training mean, ± std in the hover; eval dashed)"
    )
    static = figures.reward_svg(frames)
    return plots.div(fig, "reward") + (f"<noscript>{static}</noscript>" if static else "")


def _speedup_section(store: RunStore, runs: Sequence[Mapping[str, Any]], r: float) -> str:
    ids = [run["id"] for run in runs]
    compare = tables.compare_frame(store, ids, r)
    others = [run["id"] for run in runs if run["config"].get("strategy") != "exact"]
    paired = [tables.speedup_frame(store, i, r) for i in others]
    note = (
        "Update-phase seconds per step are medians with the first step left out (it pays one-off warm-up "
        "costs). Measured speedup = the exact run's update s/step ÷ this run's (the exact run in this "
        "report, else the run's paired exact run). Predicted = the cost model for the run's W, jagg_frac "
        f"and strategy with r = {r:g} (forward+backward ÷ forward)."
    )
    parts = [_table(compare)]
    if paired:
        parts += [
            "<h3>Against each run's paired exact run</h3>",
            _table(pd.concat(paired, ignore_index=True)),
        ]
    return "\n".join([*parts, f'<p class="note">{html.escape(note)}</p>'])


def _time_section(
    plots: _Plots, runs: Sequence[Mapping[str, Any]], frames: Mapping[int, pd.DataFrame]
) -> str:
    return "\n".join(
        plots.div(
            figures.time_breakdown_figure(frames[run["id"]], title=f"Step time — #{run['id']} {run['name']}"),
            f"time-{run['id']}",
        )
        for run in runs
    )


# ---------------------------------------------------------------------------------------------- images


def image_data_uri(path: str | os.PathLike[str], max_side: int = IMAGE_MAX_SIDE) -> tuple[str, int]:
    """(the image as a ``data:`` URI, its width in it): the file's own bytes when both sides are within
    ``max_side``, else scaled down to ``max_side`` on its longer side and encoded as JPEG (quality 90)."""
    from PIL import Image

    path = Path(path)
    raw = path.read_bytes()
    with Image.open(io.BytesIO(raw)) as img:
        width = img.width
        if max(img.size) <= max_side and path.suffix.lower() in _MIME:
            mime = _MIME[path.suffix.lower()]
        else:
            small = img.convert("RGB")
            small.thumbnail((max_side, max_side))
            buf = io.BytesIO()
            small.save(buf, "JPEG", quality=90)
            raw, mime, width = buf.getvalue(), "image/jpeg", small.width
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}", width


def _image_grid(store: RunStore, runs: Sequence[Mapping[str, Any]]) -> str:
    """One table: a row per prompt+seed, a column per (run, eval step) at each run's OWN first and last eval
    step (:func:`.images.own_step_cells`: a run with later evals never shows step 0 as its last); "" without
    images."""
    ids = [run["id"] for run in runs]
    items, cells = images.own_step_cells(store, ids, store.runs_root, limit_keys=IMAGE_ROWS)
    if not items:
        return ""
    strategy = {run["id"]: run["config"].get("strategy") for run in runs}
    heads = [f"#{run_id} {strategy[run_id]} · step {step}" for run_id, step in cells]
    rows = [items[i : i + len(heads)] for i in range(0, len(items), len(heads))]
    out = ['<table class="images"><thead><tr>']
    out += [f"<th>{html.escape(h)}</th>" for h in heads]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for path, caption in row:
            text = html.escape(caption.split(" · ", 2)[-1])  # "#1 jagg · step 0 · " is the column's head
            uri, width = image_data_uri(path)
            shown = min(max(width, 96), 256)  # tiny images enlarged (pixelated), big ones fitted to a column
            css = ' class="pixelated"' if shown > width else ""
            out.append(
                f'<td><figure><img src="{uri}" width="{shown}"{css} alt="{text}" title="{text}">'
                f"<figcaption>{text}</figcaption></figure></td>"
            )
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _images_section(store: RunStore, runs: Sequence[Mapping[str, Any]]) -> str:
    """The same prompts and seeds side by side for all runs; each run alone when they share no eval step."""
    grid = _image_grid(store, runs)
    if grid or len(runs) == 1:
        return grid or '<p class="note">no eval images (none logged, or the run folder is gone)</p>'
    parts = ['<p class="note">the runs share no prompt and seed with images; each run is shown alone</p>']
    for run in runs:
        alone = _image_grid(store, [run])
        parts.append(f"<h3>#{run['id']} {html.escape(run['name'])}</h3>")
        parts.append(alone or '<p class="note">no eval images</p>')
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------- the CLI


def _run_id(text: str) -> int:
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if not 1 <= value <= RUN_ID_MAX:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {RUN_ID_MAX}, got {text!r}")
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=_run_id, metavar="RUN", help="run ids shown by `jagg runs`")
    parser.add_argument("--out", required=True, help="the HTML file to write, e.g. report.html")
    parser.add_argument("--runs-dir", default="runs", help="runs root holding jagg.db (default: runs)")
    parser.add_argument(
        "--r",
        type=_ratio,
        default=None,
        help="cost ratio forward+backward / forward of the predicted speedup (default: 3 with an NVIDIA "
        "driver, 1.8 otherwise, as the app)",
    )


def run(args: argparse.Namespace) -> int:
    from jagg_engine.errors import UsageError

    db = Path(args.runs_dir) / DB_NAME
    if not db.is_file():
        raise UsageError(f"--runs-dir: no run database at {db}")
    try:
        check_out(args.out)  # before opening anything
        with open_store(args.runs_dir) as store:  # read-only where the folder cannot be written
            path = write_report(
                store,
                args.runs,
                args.out,
                r=args.r,
                progress=lambda line: print(f"jagg report: {line}", file=sys.stderr, flush=True),
            )
    except (ReportError, StoreError) as exc:
        raise UsageError(str(exc)) from None
    print(path)
    return 0


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem auto; max-width: 1200px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
nav, .meta, .note { color: #555; font-size: .9rem; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
thead th { background: #f4f4f4; }
table.images td { text-align: center; }
section { overflow-x: auto; }  /* many runs: wide tables scroll, the page does not */
figure { margin: 0; }
figure img { display: block; margin: 0 auto; height: auto; }
img.pixelated { image-rendering: pixelated; }
figcaption { font-size: .7rem; color: #555; max-width: 12rem; }
details summary { cursor: pointer; margin: .5rem 0; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<p class="meta">{meta}</p>
<nav>{nav}</nav>
{body}
<p class="note">Written by <code>jagg report</code> (JAGG Studio). One file, no network: plotly.js is inlined
and the images are embedded.</p>
</body>
</html>
"""
