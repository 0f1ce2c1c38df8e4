"""`jagg report` and app/report.py: one self-contained HTML file of one or more runs that opens offline.

The runs are the shipped showcase (a recorded 10-step exact run and JAGG run of tiny-shapes, paired, with
their eval images at steps 0 and 10), loaded into a temporary runs folder as the app loads it (0.5 s).
The browser test opens the file in headless Chromium and checks, from the browser's own network log and
console, that nothing outside file:// and data: was requested; a copy with one remote image and script
shows that the check sees a request when there is one.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser import chromium
from docs_pages import all_text as docs_text
from faults import mount
from PIL import Image

from app import notes, showcase
from app.report import (
    CSP,
    ReportError,
    check_out,
    image_data_uri,
    report_for_app,
    write_report,
)
from jagg_engine import cli
from jagg_engine.store import open_store

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
PLOTLY_BANNER = "* plotly.js (basic - minified) v"  # the first line of the inlined partial bundle
MAX_REPORT_BYTES = 1_500_000  # the two showcase runs' report, curves and 48 images included
# The shipped showcase's last eval step (its config's steps): the report's images are at step 0 and there.
LAST = json.loads((showcase.SHOWCASE_DIR / showcase.MANIFEST).read_text())["runs"][0]["config"]["steps"]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report") / "runs"
    with open_store(root) as store:
        assert showcase.install(store, root) == [1, 2]  # 1 = exact, 2 = jagg, paired
    return root


@pytest.fixture
def store(runs_dir):
    with open_store(runs_dir) as s:
        yield s


@pytest.fixture(scope="module")
def two_run_report(runs_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "showcase.html"
    lines: list[str] = []
    with open_store(runs_dir) as store:
        assert write_report(store, [1, 2], out, r=1.8, progress=lines.append) == out
    assert lines[0] == "reading 2 runs: #1, #2" and lines[-1].startswith(f"writing {out}")
    return out


def _cells(page: str) -> list[tuple[str, str]]:
    """(data URI, caption) of every eval image in the page, in document order."""
    return re.findall(r'<img src="(data:[^"]+)" width="\d+"[^>]* alt="([^"]*)"', page)


def _heads(page: str) -> list[str]:
    table = page.split('<table class="images">', 1)[1].split("</thead>", 1)[0]
    return [html.unescape(h) for h in re.findall(r"<th>([^<]*)</th>", table)]


def _update_median(frame) -> float:
    return float(frame["time/update"].dropna().iloc[1:].median())  # first step left out, as data.update_time


# ---------------------------------------------------------------------------------------------- content


def test_two_runs_report_holds_config_diff_curves_speedup_time_and_images(two_run_report, store):
    page = two_run_report.read_text(encoding="utf-8")
    # Offline by construction: a CSP that allows no fetch, plotly.js inlined exactly once, no external src.
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in page
    assert "default-src 'none'" in CSP and "img-src data:" in CSP
    assert page.count(PLOTLY_BANNER) == 1
    assert two_run_report.stat().st_size <= MAX_REPORT_BYTES, two_run_report.stat().st_size
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=\"(?!data:)", page)

    # Config: the fields that differ (Flow-GRPO's exact run against the default, which kept a checkpoint
    # at its step 40 for the showcase's model) and both full configs.
    diff = page.split("<h3>Fields that differ</h3>", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td>([^<]+)</td>", diff) == [
        "checkpoint_every", "0", "40", "name", "showcase-exact", "showcase-jagg",
        "ode_solver", "euler", "dpmpp-2m", "ode_steps_after", "null", "4",
        "sde_window_end", "8", "4", "strategy", "exact", "jagg",
    ]  # fmt: skip
    assert "<summary>Full configs</summary>" in page and "<td>sampling_steps</td>" in page

    # Reward curves and one step-time figure per run, plotly divs fed with the runs' data.
    for div in ("plot-reward", "plot-time-1", "plot-time-2"):
        assert f'id="{div}"' in page
    for name in ("#1 exact · total", "#2 jagg · total", "#1 exact · eval", "#2 jagg · eval"):
        assert f'"name":{json.dumps(name, ensure_ascii=False)}' in page, name

    # Speedup: the measured ratio of update-phase medians, computed here from the store's metrics.
    exact, jagg = (_update_median(store.metrics_frame(i)) for i in (1, 2))
    speedup = page.split('<section id="speedup">', 1)[1].split("</section>", 1)[0]
    assert f"<td>{round(exact / jagg, 3)}</td>" in speedup and f"<td>{round(exact, 4)}</td>" in speedup
    assert "r = 1.8" in speedup
    paired = speedup.split("<h3>Against each run's paired exact run</h3>", 1)[1].split("</table>", 1)[0]
    assert "<td>#2 (jagg)</td>" in paired and "<td>#1</td>" in paired and "(exact)" not in paired

    # Images: rows of 4 (exact and JAGG at step 0, then at the last step), each the very bytes of the run's file.
    assert _heads(page) == [
        "#1 exact · step 0",
        "#2 jagg · step 0",
        f"#1 exact · step {LAST}",
        f"#2 jagg · step {LAST}",
    ]
    cells = _cells(page)
    assert len(cells) == 4 * 12
    columns = [(1, 0), (2, 0), (1, LAST), (2, LAST)]
    samples = {
        (run_id, s["step"], s["prompt"], s["seed"]): s
        for run_id in (1, 2)
        for s in store.samples(run_id, "eval")
    }
    for n, (uri, caption) in enumerate(cells):
        run_id, step = columns[n % 4]
        prompt, seed, _reward = html.unescape(caption).split(" · ")
        sample = samples[(run_id, step, prompt, int(seed.removeprefix("seed ")))]
        run_dir = Path(store.get_run(run_id)["run_dir"])
        assert uri.startswith("data:image/png;base64,")
        assert base64.b64decode(uri.split(",", 1)[1]) == (run_dir / sample["path"]).read_bytes()
    row_keys = [html.unescape(c).rsplit(" · ", 1)[0] for _, c in cells]
    assert all(len(set(row_keys[i : i + 4])) == 1 for i in range(0, len(row_keys), 4))


def test_one_run_report_shows_its_full_config_and_its_own_first_and_last_images(store, tmp_path):
    out = write_report(store, [2], tmp_path / "one.html", r=3.0)
    page = out.read_text(encoding="utf-8")
    assert "Fields that differ" not in page and "<details open><summary>Full config</summary>" in page
    assert _heads(page) == ["#2 jagg · step 0", f"#2 jagg · step {LAST}"]
    assert len(_cells(page)) == 2 * 12 and "r = 3" in page


def test_names_and_prompts_are_escaped(store, tmp_path):
    run_id = store.create_run("<script>alert(1)</script>", {"strategy": "jagg", "steps": 1}, tmp_path / "x")
    store.log_step(run_id, 1, {"reward/mean": 0.5, "time/update": 1.0})
    page = write_report(store, [run_id], tmp_path / "esc.html").read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "no eval images" in page


def test_the_report_shows_the_notes_written_in_history(tmp_path):
    """A run's note (History's Save note, ``notes.json``) is in the report's runs table, escaped; a report of
    runs without a note has no note column."""
    root = tmp_path / "runs"
    with open_store(root) as s:
        assert showcase.install(s, root) == [1, 2]
        notes.set_note(root, 1, "the <b>baseline</b> & lr 1e-4")
        page = write_report(s, [1, 2], tmp_path / "noted.html", r=1.8).read_text(encoding="utf-8")
        bare = write_report(s, [2], tmp_path / "bare.html", r=1.8).read_text(encoding="utf-8")
    runs = page.split('<section id="runs">', 1)[1].split("</section>", 1)[0]
    heads = re.findall(r"<th>([^<]*)</th>", runs)
    rows = [re.findall(r"<td>([^<]*)</td>", row) for row in runs.split("<tbody>", 1)[1].split("<tr>")[1:]]
    assert "note" in heads and len(rows) == 2
    note = heads.index("note")
    assert rows[0][note] == "the &lt;b&gt;baseline&lt;/b&gt; &amp; lr 1e-4" and rows[1][note] == ""
    assert "<th>note</th>" not in bare.split('<section id="runs">', 1)[1].split("</section>", 1)[0]


def test_runs_without_a_shared_eval_step_are_shown_one_by_one(store, tmp_path):
    run_id = store.create_run("no-images", {"strategy": "exact", "steps": 1}, tmp_path / "y")
    store.log_step(run_id, 1, {"reward/mean": 0.5})
    page = write_report(store, [1, run_id], tmp_path / "apart.html").read_text(encoding="utf-8")
    assert "the runs share no prompt and seed with images" in page
    assert _heads(page) == ["#1 exact · step 0", f"#1 exact · step {LAST}"] and len(_cells(page)) == 24


def test_a_four_run_report_shows_each_runs_own_first_and_last_eval(tmp_path):
    """Four runs whose last evals are at steps 2, 3, 4 and 5 share only step 0: each run's last column is its
    own last eval, never step 0 under "first and last eval"."""
    root = tmp_path / "runs"
    with open_store(root) as s:
        ids = []
        for last in (2, 3, 4, 5):
            strategy = "exact" if last % 2 else "jagg"
            run_id = s.create_run(f"r{last}", {"strategy": strategy, "steps": last}, root / f"r{last}")
            for step in (0, last):
                rows = []
                for seed in (0, 1):
                    rel = f"samples/eval/step{step}-s{seed}.png"
                    (root / f"r{last}" / rel).parent.mkdir(parents=True, exist_ok=True)
                    Image.new("RGB", (8, 8), (40 * last, 20 * step, 100 * seed)).save(root / f"r{last}" / rel)
                    rows.append({"kind": "eval", "prompt": "a dot", "seed": seed, "reward": 0.1, "path": rel})
                s.log_samples(run_id, step, rows)
                s.log_step(run_id, step, {"eval/reward/mean": 0.1 * step})
            ids.append(run_id)
        page = write_report(s, ids, tmp_path / "four.html", r=1.8).read_text(encoding="utf-8")
    kinds = {2: "jagg", 3: "exact", 4: "jagg", 5: "exact"}
    firsts = [f"#{run_id} {kinds[last]} · step 0" for run_id, last in zip(ids, (2, 3, 4, 5))]
    lasts = [f"#{run_id} {kinds[last]} · step {last}" for run_id, last in zip(ids, (2, 3, 4, 5))]
    assert _heads(page) == firsts + lasts
    assert len(_cells(page)) == 2 * 8  # two prompt+seed rows of eight columns


def test_big_images_are_scaled_down_small_ones_kept_byte_for_byte(tmp_path):
    small, big = tmp_path / "small.png", tmp_path / "big.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(small)
    Image.new("RGB", (1024, 768), (0, 0, 255)).save(big)
    uri, width = image_data_uri(small)
    assert width == 32 and base64.b64decode(uri.split(",", 1)[1]) == small.read_bytes()
    uri, width = image_data_uri(big)
    assert uri.startswith("data:image/jpeg;base64,") and width == 512
    assert Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).size == (512, 384)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("run_ids", "message"),
    [
        ([1, 99], "RUN: no run with id 99 in "),
        ([1, 1], "RUN: run 1 is given twice"),
        ([], "RUN: give one or more run ids"),
        ([1.5], "RUN: must be whole numbers from 1 to 9223372036854775807, got 1.5"),
        ([True], "RUN: must be whole numbers from 1 to 9223372036854775807, got True"),
    ],
)
def test_bad_run_ids_write_nothing_and_keep_an_older_report(store, tmp_path, run_ids, message):
    out = tmp_path / "report.html"
    out.write_text("older report")
    with pytest.raises(ReportError, match=re.escape(message)):
        write_report(store, run_ids, out)
    assert out.read_text() == "older report" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("report.txt", "--out: must be a file name ending in .html, got"),
        ("missing/report.html", "--out: folder {tmp}/missing does not exist"),
        ("afile/report.html", "--out: folder {tmp}/afile is not a folder"),
        ("adir.html", "--out: {tmp}/adir.html is a folder; give a file name such as"),
    ],
)
def test_bad_out_is_one_line_naming_out(store, tmp_path, out, message):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.html").mkdir()
    with pytest.raises(ReportError, match=re.escape(message.format(tmp=tmp_path))):
        write_report(store, [1], tmp_path / out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.html", "afile"]


def _read_only(path: Path) -> Path:
    return mount("-o", "remount,bind,ro", str(path))


def test_a_full_disk_leaves_no_partial_report_and_keeps_the_older_one(store, mounts, tmp_path):
    """A 1 MiB tmpfs: the page (plotly.js's basic bundle alone is ~1.2 MB) cannot fit; the older report stays whole."""
    folder = mounts("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / "full"))
    (folder / "report.html").write_text("older report")
    with pytest.raises(ReportError, match=r"^--out: cannot write .*report\.html: No space left on device$"):
        write_report(store, [1, 2], folder / "report.html")
    assert [p.name for p in folder.iterdir()] == ["report.html"]
    assert (folder / "report.html").read_text() == "older report"


def test_a_read_only_folder_is_refused_before_any_work(store, mounts, tmp_path):
    (tmp_path / "src").mkdir()
    ro = _read_only(mounts("--bind", str(tmp_path / "src"), str(tmp_path / "ro")))
    with pytest.raises(ReportError, match=r"^--out: cannot write to .*/ro: Read-only file system$"):
        check_out(ro / "report.html")
    assert list((tmp_path / "src").iterdir()) == []


# ---------------------------------------------------------------------------------------------- the CLI


def test_cli_writes_the_report_and_prints_its_path(runs_dir, tmp_path, capsys):
    out = tmp_path / "cli.html"
    assert cli.main(["report", "1", "2", "--runs-dir", str(runs_dir), "--out", str(out), "--r", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert "jagg report: reading 2 runs: #1, #2" in captured.err and "jagg report: writing" in captured.err
    page = out.read_text(encoding="utf-8")
    assert page.count(PLOTLY_BANNER) == 1 and len(_cells(page)) == 48 and "r = 3" in page


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["7", "--out", "{tmp}/r.html"], "jagg report: error: RUN: no run with id 7 in {runs}/jagg.db"),
        (
            ["1", "--out", "{tmp}/r.pdf"],
            "jagg report: error: --out: must be a file name ending in .html, got",
        ),
        (["1", "--out", "{tmp}/no/r.html"], "jagg report: error: --out: folder {tmp}/no does not exist"),
        (["x", "--out", "{tmp}/r.html"], "jagg report: error: argument RUN: must be a whole number from 1"),
        (["0", "--out", "{tmp}/r.html"], "jagg report: error: argument RUN: must be a whole number from 1"),
        (["1", "--out", "{tmp}/r.html", "--r", "nan"], "jagg report: error: argument --r: must be a finite"),
        (["1"], "jagg report: error: the following arguments are required: --out"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(runs_dir, tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert _main(["report", *argv, "--runs-dir", str(runs_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(message.format(tmp=tmp_path, runs=runs_dir)), err
    assert list(tmp_path.iterdir()) == []


def _main(argv: list[str]) -> int:
    """cli.main's exit code, whether the parser (SystemExit) or the command (return value) refused."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_cli_without_a_run_database_creates_none(tmp_path, capsys):
    assert (
        _main(["report", "1", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "r.html")]) == 2
    )
    assert (
        capsys.readouterr().err.strip()
        == f"jagg report: error: --runs-dir: no run database at {tmp_path}/runs/jagg.db"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_reads_a_read_only_runs_folder(runs_dir, mounts, tmp_path, capsys):
    """The runs folder made read-only where it is (the history's image paths stay valid)."""
    ro = _read_only(mounts("--bind", str(runs_dir), str(runs_dir)))
    assert not os.access(ro, os.W_OK)
    out = tmp_path / "from-ro.html"
    assert cli.main(["report", "1", "--runs-dir", str(ro), "--out", str(out)]) == 0
    assert len(_cells(out.read_text(encoding="utf-8"))) == 24


# ---------------------------------------------------------------------------------------------- the app


def test_report_for_app_writes_into_its_folder_and_answers_in_one_line(store, tmp_path):
    message, path = report_for_app(store, [1, 2.0], tmp_path / "reports", r=1.8)
    assert path == tmp_path / "reports" / "jagg-report-1-2.html" and path.is_file()
    assert message.startswith("Report of runs #1, #2 written: jagg-report-1-2.html (") and "\n" not in message
    for ids, r, expected in [
        ([], 1.8, "Pick one or more runs."),
        ([1, 99], 1.8, "**Error:** runs: no run with id 99 in "),
        (["abc"], 1.8, "**Error:** runs: must be whole numbers from 1 to 9223372036854775807, got 'abc'"),
        ([1], -1.0, "**Error:** r: must be a finite number > 0, got -1.0"),
        ("12", 1.8, "**Error:** runs: must be a list of run ids, got '12'"),
    ]:
        message, path = report_for_app(store, ids, tmp_path / "bad", r=r)
        assert message.startswith(expected) and path is None, message
    assert not (tmp_path / "bad").exists()


def test_writing_a_report_imports_no_torch(runs_dir, tmp_path):
    """The app's process stays torch-free when its button writes a report (the speedup prediction included)."""
    code = (
        "import sys\nfrom jagg_engine.store import open_store\nfrom app.report import report_for_app\n"
        f"message, path = report_for_app(open_store({str(runs_dir)!r}), [1, 2], {str(tmp_path)!r}, r=1.8)\n"
        "print(path, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, heavy = proc.stdout.strip().split(" ", 1)
    assert heavy == "[]" and Path(path) == tmp_path / "jagg-report-1-2.html"
    page = Path(path).read_text(encoding="utf-8")
    # the cost model's prediction for the default (a sliding W = 4 with reuse: 2r) against the exact run's
    # 8 trained steps (8r), r = 1.8
    assert "<td>4.0</td>" in page


# ---------------------------------------------------------------------------------------------- browser


def _chromium():
    return chromium("1300,1200", logs=True)


def _open(driver, path: Path) -> tuple[list[str], list[str]]:
    """Load ``path`` and wait for its plots; (every URL the page requested, the console's messages)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("performance"), driver.get_log("browser")  # drain the logs of an earlier page
    driver.get(path.as_uri())
    WebDriverWait(driver, 60, poll_frequency=0.2).until(
        lambda d: d.execute_script(
            "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"
            " && document.querySelectorAll('.plotly-graph-div svg.main-svg').length >= 3"
        )
    )
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls, [entry["message"] for entry in driver.get_log("browser")]


def _outside(urls: list[str], console: list[str]) -> list[str]:
    """Requests that left the file (anything but file:// and data:) and fetches the CSP blocked."""
    return [u for u in urls if not u.startswith(("file://", "data:"))] + [
        m for m in console if "Content Security Policy" in m
    ]


def test_browser_opens_the_report_offline_with_curves_and_images(two_run_report, tmp_path):
    driver = _chromium()
    try:
        urls, console = _open(driver, two_run_report)
        assert urls[0] == two_run_report.as_uri()
        assert _outside(urls, console) == [], (urls, console)
        assert not [m for m in console if "SEVERE" in m or "Uncaught" in m], console
        shown = driver.execute_script(
            """
            const plot = id => document.getElementById(id);
            return {
              reward_traces: plot('plot-reward').querySelectorAll('.scatterlayer .trace path.js-line').length,
              time_bars: ['plot-time-1', 'plot-time-2'].map(
                id => plot(id).querySelectorAll('.barlayer .point path').length),
              images: document.querySelectorAll('table.images img').length,
              decoded: [...document.querySelectorAll('table.images img')]
                .filter(i => i.complete && i.naturalWidth === 32 && i.getBoundingClientRect().width >= 96).length,
            };
            """
        )
        # Train and eval lines of both runs (the 10-step trend line needs 5 steps: it is there too).
        assert shown["reward_traces"] >= 4, shown
        assert shown["time_bars"] == [LAST * 5] * 2, shown  # steps × 5 phases, per run
        assert shown["images"] == 48 and shown["decoded"] == 48, shown
        ARTIFACTS.mkdir(exist_ok=True)
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1300, min(height + 40, 6000))
        driver.save_screenshot(str(ARTIFACTS / "report-showcase.png"))
        assert (ARTIFACTS / "report-showcase.png").stat().st_size > 50_000

        # The check sees a request when there is one: the same page with a remote image and script.
        bad = tmp_path / "with-remote.html"
        remote = (
            '<img src="https://example.invalid/x.png"><script src="https://example.invalid/p.js"></script>'
        )
        bad.write_text(two_run_report.read_text(encoding="utf-8").replace("<nav>", remote + "<nav>", 1))
        urls, console = _open(driver, bad)
        assert len(_outside(urls, console)) >= 2, (urls, console)
    finally:
        driver.quit()


def test_readme_command_runs_as_written(runs_dir):
    """README's `jagg report` line, run as written beside a runs/ folder that holds the showcase (the app
    loads it there)."""
    line = next(l for l in docs_text().splitlines() if l.startswith("jagg report "))
    argv = line.split("#", 1)[0].split()
    out = runs_dir.parent / argv[argv.index("--out") + 1]
    jagg = shutil.which("jagg")
    cmd = [jagg, *argv[1:]] if jagg else [sys.executable, "-m", "jagg_engine.cli", *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run(cmd, cwd=runs_dir.parent, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == argv[argv.index("--out") + 1]
        assert len(_cells(out.read_text(encoding="utf-8"))) == 48
    finally:
        out.unlink(missing_ok=True)


def test_the_apps_report_button_writes_the_picked_runs_report(tmp_path):
    from app import ui

    root = tmp_path / "runs"
    with open_store(root) as s:
        assert showcase.install(s, root) == [1, 2]
    demo = ui.build_app(root, background_ticks=False, showcase_dir=None)
    try:
        report = next(f.fn for f in demo.fns.values() if f.api_name == "report_runs")
        message, published = report([1, 2], 1.8)
        assert message.startswith("Report of runs #1, #2 written: jagg-report-1-2.html"), message
        page = Path(published).read_text()
        assert page.count(PLOTLY_BANNER) == 1 and "showcase-exact" in page and "showcase-jagg" in page
        assert (root / "exports" / "jagg-report-1-2.html").is_file()
        assert report([1], "fast") == ("**Error:** r: must be a finite number > 0, got 'fast'", None)
        assert report(None, 1.8) == ("Pick one or more runs.", None)
    finally:
        demo.jagg_stop_ticker.set()
        demo.jagg_manager.shutdown()
