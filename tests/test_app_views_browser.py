"""The metrics views' controls in headless Chromium (`python launch.py` over a runs folder the test writes):
each control of a 4-run Compare redraws the right traces in the page with no server call (how fast is
`scripts/bench_ui.py`'s figure, not a test's: no wall-clock budget here), the view kept in the address, a
bad reward level that keeps the view, a run switch beside a training run that never shows the previous run's
panels, a training run's plots that get only their new points and then equal a whole redraw, and a step
slider that no refresh moves back once the user moved it.

Runs #3–#6: 40 steps each (eval every 5), two exact and two JAGG, with clock times; run #7 "trains" (a
thread of the test logs a step every 0.6 s, an eval image every second step, while the Live tests run).
The shipped showcase is runs #1–#2 (the first screen).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from browser import chromium, live_app, until
from PIL import Image

from app import showcase
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
GUARD_MS = 120_000  # a redraw not seen within this is reported as never drawn (a hang guard, not a budget)
STEPS = 40
TRIALS = 5
SWITCH_GRACE_MS = 250  # from the page's handling of Enter to the next frames, under load


def _image(store, root: Path, run_id: int, step: int, shade: int) -> None:
    rel = f"samples/eval/step_{step:05d}/a_seed0.png"
    path = root / f"run-{run_id:04d}" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), (shade % 256, 40, 90)).save(path)
    store.log_samples(
        run_id, step, [{"kind": "eval", "prompt": "a circle", "seed": 0, "reward": 0.5, "path": rel}]
    )


def _fill(root: Path) -> None:
    with open_store(root) as store:
        assert showcase.install(store, root) == [1, 2]
        base = TrainConfig().apply_overrides(["eval_every=5"]).to_dict()
        for n in range(3, 7):
            strategy = "exact" if n % 2 else "jagg"
            cfg = {**base, "steps": STEPS, "strategy": strategy, "output_dir": str(root.resolve())}
            run_id = store.create_run(f"run{n}", cfg, None)
            store.set_run_dir(run_id, root / f"run-{run_id:04d}")
            store.set_status(run_id, "running", pid=None)
            t0 = time.time() - 3600
            for step in range(STEPS + 1):
                row = {"time/unix": t0 + (6 if strategy == "exact" else 3) * step}
                if step:
                    row |= {"reward/mean": 0.01 * step + 0.002 * n, "loss/clipfrac": 0.05 + 0.01 * (step % 7),
                            "grad/norm": 2.0 / step, "time/step": 3.0, "time/train_elapsed": 3.0 * step}  # fmt: skip
                if step % 5 == 0:
                    row["eval/reward/mean"] = 0.2 + 0.01 * step * (1.5 if strategy == "jagg" else 1.0)
                store.log_step(run_id, step, row)
            store.set_status(run_id, "finished")
            store.set_times(run_id, t0, t0, row["time/unix"])
            (root / f"run-{run_id:04d}").mkdir(parents=True, exist_ok=True)
            (root / f"run-{run_id:04d}" / "train.log").write_text(f"log of run{n}\n")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with live_app(tmp_path_factory, "views", _fill) as live:
        yield live


def _driver(url: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    driver.get(url)
    WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.XPATH, "//button[@role='tab']"))
    return driver


PLOT = """
const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!g || !g._fullData) return null;
return {names: g._fullData.map(t => t.name), visible: g._fullData.map(t => t.visible),
        ys: g._fullData.map(t => Array.from(t.y || [])), xs: g._fullData.map(t => Array.from(t.x || [])),
        meta: g.data.filter(t => t.meta && t.meta.jagg).length,
        xtype: g._fullLayout.xaxis.type, ytype: g._fullLayout.yaxis.type,
        xtitle: (g._fullLayout.xaxis.title || {}).text};
"""

# Runs an action in the page and returns the milliseconds from just before it to the first animation frame
# at which `done` (a JS expression over `g`, the plot) holds; -1 past `limit` ms.
TIMED = """
const [action, plotId, done, limit, finish] = arguments;
const graph = () => document.querySelector('#' + plotId + ' .js-plotly-plot');
const check = new Function('g', 'return (' + done + ');');
const t0 = performance.now();
new Function(action)();
const poll = () => {
  const g = graph();
  if (g && g._fullLayout && check(g)) return finish(performance.now() - t0);
  if (performance.now() - t0 > limit) return finish(-1);
  requestAnimationFrame(poll);
};
requestAnimationFrame(poll);
"""


def timed(driver, action: str, plot_id: str, done: str, limit_ms: float = GUARD_MS) -> float:
    """``action`` run in the page; the milliseconds to the first frame at which ``done`` holds (-1: never)."""
    driver.set_script_timeout(limit_ms / 1000 + 30)
    return float(driver.execute_async_script(TIMED, action, plot_id, done, limit_ms))


# Runs an action in the page and returns the milliseconds from just before it to the first animation frame at
# which #compare-msg's text holds `said`; -1 past `limit` ms.
TIMED_TEXT = """
const [action, said, limit, finish] = arguments;
const t0 = performance.now();
new Function(action)();
const poll = () => {
  const m = document.getElementById('compare-msg');
  if (m && m.textContent.includes(said)) return finish(performance.now() - t0);
  if (performance.now() - t0 > limit) return finish(-1);
  requestAnimationFrame(poll);
};
requestAnimationFrame(poll);
"""


def _set_text(elem_id: str, text: str) -> str:
    return (
        f"const i = document.querySelector('#{elem_id} textarea, #{elem_id} input'); i.value = {text!r};"
        "i.dispatchEvent(new Event('input', {bubbles: true}));"
    )


def _reach_rows(driver) -> list:
    """The time-to-reach table's cells as the page shows them, word by word after its header (numbers read
    as numbers: gradio shows 90.0 as 90)."""
    from selenium.webdriver.common.by import By

    text = driver.find_element(By.ID, "compare-reach").text
    return [_cell(word) for word in text.split("final eval", 1)[1].split()]


def _cell(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _server_reach(root: Path, ids: list[int]):
    """level → the server's time-to-reach table (app.metrics.reach_frame) for runs ``ids``, cells as text."""
    from app import metrics

    with open_store(root) as store:
        runs = [store.get_run(i) for i in ids]
        frames = {f"#{r['id']} {r['config']['strategy']}": store.metrics_frame(r["id"]) for r in runs}

    def table(level: float | None) -> list:  # None: the default level
        frame = metrics.reach_frame(frames, level if level is not None else metrics.default_level(frames)[0])
        return [_cell(word) for row in frame.itertuples(index=False) for v in row for word in str(v).split()]

    return table


def _click_label(elem_id: str, label: str) -> str:
    return (
        f"[...document.querySelectorAll('#{elem_id} label')]"
        f".find(l => l.textContent.trim() === {label!r}).click();"
    )


def _set_number(elem_id: str, value: float) -> str:
    return (
        f"const i = document.querySelector('#{elem_id} input[type=number]'); i.value = '{value}';"
        "i.dispatchEvent(new Event('input', {bubbles: true})); i.dispatchEvent(new Event('change', {bubbles: true}));"
    )


def timed_text(driver, action: str, said: str, limit_ms: float = GUARD_MS) -> float:
    """``action`` run in the page; the milliseconds to the first frame at which #compare-msg says ``said``."""
    driver.set_script_timeout(limit_ms / 1000 + 30)
    return float(driver.execute_async_script(TIMED_TEXT, action, said, limit_ms))


CONTROLS = ("compare-x", "compare-smoothing", "compare-log-scale", "compare-shown", "compare-level")
X_TITLES = {"wall time": "wall time", "relative time": "relative time (s)", "step": "step"}
LEVELS = (("0.5", 0.5, "the level asked"), ("0.7", 0.7, "the level asked"),
          ("", 0.6, "the lower of the final evals, #3 exact's"))  # fmt: skip


def control_steps(driver, trial: int):
    """One trial of Compare's controls, each to a new value: (name, action, plot id, what the redrawn plot
    shows: a JS expression over ``g``). Lazy: each step's expected plot is read after the step before it."""
    for x, kind in (("wall time", "date"), ("step", "linear"), ("relative time", "linear")):
        done = f"g._fullLayout.xaxis.type === {kind!r} && g._fullLayout.xaxis.title.text === {X_TITLES[x]!r}"
        yield "x axis " + x, _click_label("compare-x", x), "compare-plot", done
    before = driver.execute_script(PLOT, "compare-metrics")
    clip = before["names"].index("#3 exact · loss/clipfrac")
    smoothing = (0.9, 0.3)[trial % 2]
    done = f"g._fullData[{clip}].y[5] !== {before['ys'][clip][5]}"
    yield "smoothing", _set_number("compare-smoothing", smoothing), "compare-metrics", done
    log = "log" if trial % 2 == 0 else "linear"
    click = "document.querySelector('#compare-log-scale input').click();"
    yield "log scale", click, "compare-metrics", f"g._fullLayout.yaxis.type === {log!r}"
    hidden = "true" if trial % 2 == 0 else "false"
    done = f"g._fullData.filter(t => t.name.startsWith('#5 exact')).every(t => (t.visible === false) === {hidden})"
    yield "runs shown", _click_label("compare-shown", "#5 exact"), "compare-plot", done


def component_ids(driver, elem_ids) -> dict[str, int]:
    """elem_id → gradio's component id (what a server call names as its trigger)."""
    found = driver.execute_script(
        "return window.gradio_config.components.filter(c => c.props && arguments[0].includes(c.props.elem_id))"
        ".map(c => [c.props.elem_id, c.id])",
        list(elem_ids),
    )
    return dict(found)


def server_calls(driver) -> list[int]:
    """The trigger ids of the server calls (gradio's queue/join requests) the page sent since the last look,
    from Chromium's network log."""
    triggers = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] != "Network.requestWillBeSent":
            continue
        request = message["params"]["request"]
        if "/queue/join" in request["url"] and request.get("postData"):
            triggers.append(json.loads(request["postData"]).get("trigger_id"))
    return triggers


def test_each_control_of_a_four_run_compare_redraws_in_the_page_with_no_server_call_and_keeps_the_view(app):
    """Each control five times, each to a new value: the plot shows the new view (its axis, its smoothed
    curve, its scale, the runs hidden) and no control sends the server anything, neither by the page's
    config (no server function listens to them) nor on the wire (Chromium's network log; pressing Compare,
    which does call the server, shows there). The view stays in the address across a reload."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400", logs=True)
    driver.get(app.url + "?tab=compare&runs=3,4,5,6")
    try:
        wait = WebDriverWait(driver, 120, poll_frequency=0.2)
        wait.until(lambda d: ((driver.execute_script(PLOT, "compare-metrics") or {}).get("meta") or 0) > 0)
        wait.until(lambda d: ((driver.execute_script(PLOT, "compare-plot") or {}).get("meta") or 0) > 0)
        reward = driver.execute_script(PLOT, "compare-plot")
        assert {n.split(" · ")[0] for n in reward["names"]} == {"#3 exact", "#4 jagg", "#5 exact", "#6 jagg"}
        chips = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#compare-runs .token")]
        assert len(chips) == 4, chips
        ids = component_ids(driver, [*CONTROLS, "compare-btn"])
        assert set(ids) == {*CONTROLS, "compare-btn"}, ids
        listening = driver.execute_script(
            "return window.gradio_config.dependencies.filter(d => d.backend_fn)"
            ".flatMap(d => (d.targets || []).map(t => t[0]))"
        )
        assert not {ids[c] for c in CONTROLS} & set(listening), listening  # no server function on a control
        assert ids["compare-btn"] in listening  # the check sees one where there is one
        server_calls(driver)  # what the page sent while loading
        calls: list[int] = []
        for trial in range(TRIALS):
            for name, action, plot_id, done in control_steps(driver, trial):
                assert timed(driver, action, plot_id, done) >= 0, (trial, name, "never redrawn")
                calls += server_calls(driver)
            if trial == 0:
                driver.execute_script(_click_label("compare-x", "wall time"))
                wait.until(lambda d: d.execute_script(PLOT, "compare-plot")["xtype"] == "date")
                assert driver.execute_script(PLOT, "compare-metrics")["xtype"] == "date"
                walls = driver.execute_script(PLOT, "compare-plot")
                last = next(x for n, x in zip(walls["names"], walls["xs"]) if n == "#3 exact · eval")[-1]
                assert abs(last / 1000 - (time.time() - 3600 + 6 * STEPS)) < 600  # Unix ms of the eval
                driver.execute_script(_click_label("compare-x", "relative time"))
                wait.until(lambda d: d.execute_script(PLOT, "compare-plot")["xtitle"] == "relative time (s)")
                rel = driver.execute_script(PLOT, "compare-plot")
                exact_eval = next(x for n, x in zip(rel["names"], rel["xs"]) if n == "#3 exact · eval")
                assert exact_eval[-1] == pytest.approx(6 * STEPS, abs=1.0)  # seconds since the start
        # the last trial leaves: x relative time, smoothing 0.9, log on, #5 hidden
        shown = driver.execute_script(PLOT, "compare-plot")
        assert all(v is False for n, v in zip(shown["names"], shown["visible"]) if n.startswith("#5 exact"))
        assert all(
            v is not False for n, v in zip(shown["names"], shown["visible"]) if n.startswith("#3 exact")
        )
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-compare-controls.png"))

        # The reward level, in the page: the time-to-reach sentence and table recomputed from the eval traces,
        # equal to the server's table at each level, with no server call and the plots not drawn again.
        server = _server_reach(app.runs_dir, [3, 4, 5, 6])
        for trial in range(TRIALS):
            for text, level, whose in LEVELS:
                said = f"Time to reach eval reward {level:g} ({whose})."
                assert timed_text(driver, _set_text("compare-level", text), said) >= 0, (text, "never shown")
                if trial == 0:
                    assert _reach_rows(driver) == server(level if text else None), text
        kept = driver.execute_script(PLOT, "compare-plot")
        assert kept["visible"] == shown["visible"]  # the plots were not drawn again
        assert timed_text(driver, _set_text("compare-level", "0.5"), "(the level asked)") >= 0
        table = _reach_rows(driver)
        # a typo: its one line, and the table and plots stay
        assert timed_text(driver, _set_text("compare-level", "0.5x"), "must be a number") >= 0
        assert (
            "reward level: must be a number or empty, got '0.5x'"
            in driver.find_element(By.ID, "compare-msg").text
        )
        assert _reach_rows(driver) == table
        assert driver.execute_script(PLOT, "compare-plot")["visible"] == shown["visible"]
        assert timed_text(driver, _set_text("compare-level", "0.5"), "(the level asked)") >= 0
        calls += server_calls(driver)
        assert not {ids[c] for c in CONTROLS} & set(calls), calls  # not one control called the server
        # the network log does see a server call where there is one: Compare pressed
        driver.execute_script("document.querySelector('#compare-btn').click()")
        pressed: list[int] = []
        wait.until(lambda d: ids["compare-btn"] in pressed or pressed.extend(server_calls(d)))
        wait.until(lambda d: ((d.execute_script(PLOT, "compare-plot") or {}).get("meta") or 0) > 0)

        # The view is in the address; a reload (or the link, shared) opens the same view.
        query = driver.execute_script("return window.location.search")
        for part in ("tab=compare", "runs=3%2C4%2C5%2C6", "x=relative+time", "smoothing=0.9", "log=1"):
            assert part in query, query
        driver.refresh()
        wait.until(lambda d: ((d.execute_script(PLOT, "compare-metrics") or {}).get("meta") or 0) > 0)
        wait.until(lambda d: (d.execute_script(PLOT, "compare-metrics") or {}).get("ytype") == "log")
        again = driver.execute_script(PLOT, "compare-plot")
        assert again["xtitle"] == "relative time (s)", again
        checked = driver.execute_script(
            "return [document.querySelector('#compare-smoothing input[type=number]').value,"
            "document.querySelector('#compare-log-scale input').checked]"
        )
        assert checked == ["0.9", True], checked
    finally:
        driver.quit()


class Trainer:
    """Run #7 "training": a thread logs a step every 0.6 s (an eval image every second step, an eval reward
    every third) and appends to its train.log, so that every timer tick of the page has something new to draw."""

    def __init__(self, root: Path):
        self.root, self.stop, self.step = root, threading.Event(), 0
        self.paused = threading.Event()  # set: no new step (a test that must read "the newest step" holds it)
        self.lock = threading.Lock()  # held while a step is logged
        with open_store(root) as store:
            cfg = {**TrainConfig().to_dict(), "steps": 500, "output_dir": str(root.resolve())}
            self.run_id = store.create_run("run7", cfg, None)
            store.set_run_dir(self.run_id, root / f"run-{self.run_id:04d}")
            store.set_status(self.run_id, "running", pid=None)
        (root / f"run-{self.run_id:04d}").mkdir(parents=True, exist_ok=True)
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        with open_store(self.root) as store:
            while not self.stop.wait(0.6):
                with self.lock:
                    if not self.paused.is_set():
                        self.log_one(store)

    def log_one(self, store) -> None:
        """One more step of the run."""
        self.step += 1
        if self.step % 2 == 0:
            _image(store, self.root, self.run_id, self.step, 10 * self.step)
        row = {"reward/mean": 0.01 * self.step, "time/unix": time.time(), "time/step": 0.6}
        if self.step % 3 == 0:  # an eval now and then: the reward plot's eval line grows too
            row |= {"eval/reward/mean": 0.02 * self.step, "time/train_elapsed": 0.6 * self.step}
        store.log_step(self.run_id, self.step, row)
        with (self.root / f"run-{self.run_id:04d}" / "train.log").open("a") as log:
            log.write(f"log of run7 step {self.step}\n")

    def __enter__(self) -> Trainer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


# Every animation frame from now on: the progress line and the log as the page shows them (nothing where
# they are hidden).
WATCH = """
window.jaggSeen = [];
const shown = (el) => el && getComputedStyle(el).visibility !== 'hidden';
const look = () => {
  const p = document.querySelector('#live-progress'), log = document.querySelector('#live-log textarea');
  window.jaggSeen.push([performance.now(), shown(p) ? p.innerText : '', shown(log) ? log.value : '',
                        p ? p.textContent : '']);
  if (window.jaggSeen.length < 100000) requestAnimationFrame(look);
};
requestAnimationFrame(look);
"""


# What Live shows, for a wait's failure message: the progress line (and whether it is shown), the log's tail,
# the run picker's box, the toasts.
LIVE_STATE = """
const p = document.querySelector('#live-progress'), log = document.querySelector('#live-log textarea');
const box = document.querySelector('#live-run input');
return {progress: p ? p.textContent : null, progress_visibility: p ? getComputedStyle(p).visibility : null,
        log: log ? log.value.slice(-120) : null, picked: box ? box.value : null,
        toasts: [...document.querySelectorAll('[data-testid="toast-body"]')].map(t => t.innerText)};
"""


def _pick_run(driver, run_id: int) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(run_id))
    time.sleep(0.3)
    # the switch's time is the page's handling of Enter (the pickers' script leaves the box), not the moment
    # the test sends the key: on a loaded machine the key can reach the page a while later
    driver.execute_script(
        "window.jaggSwitchAt = null; const box = arguments[0];"
        "box.addEventListener('focusout', () => { window.jaggSwitchAt = performance.now(); }, {once: true});",
        box,
    )
    box.send_keys(Keys.ENTER)


def test_a_run_switch_beside_a_training_run_never_shows_the_previous_runs_panels(app):
    from selenium.webdriver.support.ui import WebDriverWait

    with Trainer(app.runs_dir) as trainer:
        live = trainer.run_id
        driver = _driver(app.url + f"?tab=live&run={live}")
        try:
            wait = WebDriverWait(driver, 120, poll_frequency=0.1)
            wait.until(lambda d: f"Run #{live} run7" in d.find_element("id", "live-progress").text)
            wait.until(lambda d: "log of run7" in d.execute_script(
                "return (document.querySelector('#live-log textarea') || {}).value || ''"))  # fmt: skip
            for old, new, old_log, new_log in (
                (live, 3, "log of run7", "log of run3"),
                (3, live, "log of run3", "log of run7"),
                (live, 5, "log of run7", "log of run5"),
            ):
                time.sleep(1.3)  # a timer tick for the old run is likely in flight
                driver.execute_script(WATCH)
                _pick_run(driver, new)
                until(
                    driver,
                    lambda d, new=new: f"Run #{new} " in d.find_element("id", "live-progress").text,
                    f"the progress line of run {new}, picked after run {old}",
                    state=LIVE_STATE,
                    app=app,
                )
                wait.until(lambda d, new_log=new_log: new_log in d.execute_script(
                    "return (document.querySelector('#live-log textarea') || {}).value || ''"))  # fmt: skip
                time.sleep(6.0)  # three timer ticks beside the training run
                seen = driver.execute_script("return window.jaggSeen")
                switched = driver.execute_script("return window.jaggSwitchAt")
                assert switched is not None  # Enter was handled: the box was left
                # from a frame after the switch (Enter pressed, and gradio's picker took it), none shows the
                # old run's progress line or log: not while the new run is read, nor after a refresh
                again = [
                    (round(t - switched), p[:40], log[-30:])
                    for t, p, log, _ in seen
                    if t > switched + SWITCH_GRACE_MS and (f"Run #{old} " in p or old_log in log)
                ]
                assert not again, (old, new, again[:5])
                # nor does the page receive it, hidden or not: once the progress line names the new run, no
                # answer for the old one lands (a tick in flight for it at the switch is cancelled)
                arrived = next(t for t, _, _, raw in seen if t > switched and f"Run #{new} " in raw)
                landed = [
                    round(t - arrived) for t, _, _, raw in seen if t > arrived and f"Run #{old} " in raw
                ]
                assert not landed, (old, new, landed[:5])
                assert f"Run #{new} " in seen[-1][1] and new_log in seen[-1][2], seen[-1]
            # An answer for the previous run landing now (a refresh sent before the switch) is never shown:
            # the panels hide while the progress line names another run than the one picked.
            hidden = driver.execute_script(
                "const p = document.querySelector('#live-progress p'); p.textContent = 'Run #3 run3 — step 1';"
                "return new Promise(r => requestAnimationFrame(() => r(['live-log', 'live-reward', "
                "'step-gallery'].map(id => getComputedStyle(document.getElementById(id)).visibility))));"
            )
            assert hidden == ["hidden", "hidden", "hidden"], hidden
        finally:
            driver.quit()


# From now on, every change of: the slider's box, the run picked, the step note, the newest step the page was
# told (jaggView.latest); each watchRun call; each Enter in the slider's box with the newest step told then.
SLIDER_TRACE = """
window.jaggSlider = [];
const look = () => {
  const v = [document.querySelector('#step-slider input[type=number]').value,
             document.querySelector('#live-run input').value,
             (document.querySelector('#step-note') || {}).innerText, Math.round(performance.now()),
             window.jaggView.latest];
  const l = window.jaggSlider[window.jaggSlider.length - 1];
  if (!l || l[0] !== v[0] || l[1] !== v[1] || l[2] !== v[2] || l[4] !== v[4]) window.jaggSlider.push(v);
  requestAnimationFrame(look);
};
look();
const watch = window.jaggView.watchRun;
window.jaggView.watchRun = (...a) => {
  window.jaggSlider.push(['watchRun', String(a[0]), window.jaggView.latest]); return watch(...a);
};
document.querySelector('#step-slider input[type=number]').addEventListener('keydown', (e) => {
  if (e.key === 'Enter') window.jaggSlider.push(['enter', e.target.value, window.jaggView.latest]);
}, true);
"""


def _told(driver) -> list[int]:
    """The newest steps the page was told, in order, as the trace saw them."""
    seen = driver.execute_script("return window.jaggSlider")
    out: list[int] = []
    for v in seen:
        if v[0] not in ("watchRun", "enter") and v[4] is not None and (not out or out[-1] != v[4]):
            out.append(int(v[4]))
    return out


def test_the_step_slider_is_never_moved_by_a_refresh_once_the_user_moved_it(app):
    """The slider on the newest step follows each new one; moved by the user (typed 2), no refresh moves it,
    however many newer steps the page is told; put back on the newest step told, it follows the next one. Each
    wait is on the page's state (the newest steps it was told), never on a clock; the trace is printed by a
    failing assert."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    with Trainer(app.runs_dir) as trainer:
        live = trainer.run_id
        driver = _driver(app.url + f"?tab=live&run={live}")
        try:
            wait = WebDriverWait(driver, 120, poll_frequency=0.1)
            value = "return (document.querySelector('#step-slider input[type=number]') || {}).value"
            wait.until(lambda d: int(d.execute_script(value) or 0) >= 4)  # it follows the newest eval
            wait.until(lambda d: int(d.execute_script(value)) > 4)
            number = driver.find_element(By.CSS_SELECTOR, "#step-slider input[type='number']")
            driver.execute_script(SLIDER_TRACE)
            trace = lambda: json.dumps(driver.execute_script("return window.jaggSlider"))  # noqa: E731
            for attempt in range(3):
                before = len(driver.execute_script("return window.jaggSlider"))
                # select and type in one command: a tick's new slider bounds re-render the box, which drops a selection
                # made by an earlier command (the "2" then lands after the old value)
                number.send_keys(Keys.CONTROL, "a", Keys.NULL, "2", Keys.ENTER)
                try:
                    WebDriverWait(driver, 60, poll_frequency=0.1).until(
                        lambda d: "at step 2 " in d.find_element(By.ID, "step-note").text
                    )
                    break
                except TimeoutException:
                    seen = driver.execute_script("return window.jaggSlider")
                    # the box read 2 and then moved: that is the fault this test is about
                    assert not any(v[0] == "2" for v in seen[before:] if v[0] != "enter"), trace()
                    # else the keys did not make a 2 (a re-render between them): the user types it again
                    assert attempt < 2, trace()
            typed = len(driver.execute_script("return window.jaggSlider"))
            told = len(_told(driver))
            # three newer steps told (three refreshes that would have moved a following slider)
            wait.until(lambda d: len(_told(d)) >= told + 3)
            seen = driver.execute_script("return window.jaggSlider")
            values = {v[0] for v in seen[typed - 1 :] if v[0] not in ("watchRun", "enter")}
            assert values == {"2"}, trace()
            assert "at step 2 " in driver.find_element(By.ID, "step-note").text
            # back on the newest step told, the slider follows the next one (a newer step told between the read
            # and Enter makes the typed one the step before, where the slider rightly stays: typed again). The run
            # holds still while the user reads and types: on a busy machine the page's round trip is longer than
            # the run's step, and the newest step would always move on before Enter
            with trainer.lock:  # no step half logged
                trainer.paused.set()
            last_image = trainer.step - trainer.step % 2  # images at even steps
            wait.until(lambda d: d.execute_script("return window.jaggView.latest") == last_image)
            for attempt in range(3):
                newest = driver.execute_script("return String(window.jaggView.latest)")
                number.send_keys(Keys.CONTROL, "a", Keys.NULL, newest, Keys.ENTER)
                wait.until(
                    lambda d: any(v[0] == "enter" for v in d.execute_script("return window.jaggSlider"))
                )
                enter = [v for v in driver.execute_script("return window.jaggSlider") if v[0] == "enter"][-1]
                driver.execute_script("window.jaggSlider = window.jaggSlider.filter(v => v[0] !== 'enter')")
                if enter[1] != newest or enter[2] != int(newest):
                    assert attempt < 2, trace()
                    continue  # the box did not read the newest told at Enter: the user types it again
                trainer.paused.clear()
                wait.until(
                    lambda d, n=int(newest): (d.execute_script("return window.jaggView.latest") or 0) > n
                )
                followed = driver.execute_script("return window.jaggView.latest")
                try:
                    WebDriverWait(driver, 60, poll_frequency=0.1).until(
                        lambda d, f=followed: int(d.execute_script(value)) >= f
                    )
                except TimeoutException:
                    raise AssertionError(
                        "the slider put on the newest step does not follow: " + trace()
                    ) from None
                break
        finally:
            driver.quit()


def test_the_first_screen_is_the_showcase_on_a_time_axis_with_its_headline_and_whole_captions(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver(app.url)
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#showcase-curves .curve"))
        headline = driver.find_element(By.ID, "showcase-headline").text
        assert headline.startswith("To reach eval reward ") and "#2 jagg trains" in headline, headline
        assert "× sooner" in headline and "× faster than its paired exact run" in headline, headline
        svg = driver.find_element(By.ID, "showcase-curves").text
        assert "training time (s, evals excluded)" in svg and "step" not in svg.split("excluded)")[-1], svg
        checked = driver.execute_script(
            "return [...document.querySelectorAll('#compare-x input')].filter(i => i.checked).map(i => i.value)"
        )
        assert checked == ["training time"], checked
        # the sentence's seconds are the plot's: Compare draws the showcase on the radio's axis, with JAGG's
        # eval at the step the sentence names at the seconds it says
        found = re.search(r"#2 jagg trains (\d+) s \(step (\d+)\)", headline)
        assert found and "evals excluded" in headline, headline
        driver.execute_script("document.querySelector('#compare-btn').click()")
        wait.until(lambda d: ((d.execute_script(PLOT, "compare-plot") or {}).get("meta") or 0) > 0)
        plot = driver.execute_script(PLOT, "compare-plot")
        assert plot["xtitle"] == "training time (s, evals excluded)", plot["xtitle"]
        steps = driver.execute_script(
            "return document.querySelector('#compare-plot .js-plotly-plot').data"
            ".find(t => t.name === '#2 jagg · eval').meta.jagg.step"
        )
        xs = next(x for n, x in zip(plot["names"], plot["xs"]) if n == "#2 jagg · eval")
        assert round(xs[steps.index(int(found.group(2)))]) == int(found.group(1)), (xs, headline)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#compare-gallery .caption-label")) >= 8)
        captions = driver.execute_script(
            "return [...document.querySelectorAll('#compare-gallery .caption-label')].map(c => "
            "[c.textContent, c.scrollWidth <= c.clientWidth + 1, getComputedStyle(c).textOverflow])"
        )
        assert all(text.rsplit(" · ", 1)[-1].startswith("reward ") for text, _, _ in captions), captions[:2]
        assert all(whole and overflow != "ellipsis" for _, whole, overflow in captions), captions[:2]
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-showcase-first-screen.png"))
    finally:
        driver.quit()


# Every Live plot as the page holds it: per trace its name, mode, x, y and the series of its meta; the revision
# the page holds, and whether the last draw was a delta appended in the page (layout.datarevision) or whole.
HELD = """
const out = {};
for (const el of document.querySelectorAll('[id^="live-"] .js-plotly-plot')) {
  const id = el.closest('[id^="live-"]').id;
  out[id] = {rev: ((el.layout.meta || {}).jagg || {}).rev || null, appended: el.layout.datarevision !== undefined,
             notes: (el.layout.annotations || []).map(a => a.text),
             traces: el.data.map(t => ({name: t.name, mode: t.mode || null, x: window.jaggView.values(t.x),
                                        y: window.jaggView.values(t.y), meta: (t.meta || {}).jagg || null}))};
}
return out;
"""


# Plot arguments[0] made to hold a figure the server never sent: no curve, a note, a revision of its own.
STALE = """
const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const layout = JSON.parse(JSON.stringify(gd.layout));
layout.meta = {jagg: Object.assign({}, (layout.meta || {}).jagg, {rev: '0123456789abcdef'})};
layout.annotations = [{text: 'not the figure last sent', showarrow: false, xref: 'paper', yref: 'paper', x: 0.5,
                       y: 0.5}];
window.Plotly.react(gd, [], layout);
"""


def _differs(a, b, path: str = "") -> str | None:
    """Where two JSON values first differ (numbers to 1e-9: the page's EMA and the server's are two float
    computations), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a)} vs {sorted(b)}"
        return next((d for k in a if (d := _differs(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items ({a[-3:]} vs {b[-3:]})"
        return next(
            (d for i, (x, y) in enumerate(zip(a, b, strict=True)) if (d := _differs(x, y, f"{path}[{i}]"))),
            None,
        )
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return None if abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b)) else f"{path}: {a} vs {b}"
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def _settled(driver, tick_s: float = 2.0) -> dict:
    """The page's plots once three ticks in a row changed nothing (a bound of 5 min only stops a hang)."""
    last, quiet, deadline = None, 0, time.time() + 300
    while quiet < 3 and time.time() < deadline:
        time.sleep(tick_s)
        held = driver.execute_script(HELD)
        revs = {plot: held[plot]["rev"] for plot in held}
        quiet = quiet + 1 if revs == last else 0
        last = revs
    assert quiet >= 3, "the page's plots never settled"
    return held


def test_a_training_runs_plots_get_only_their_new_points_and_then_equal_a_whole_redraw(app):
    """A tick of the run the page shows sends each plot's new points (app.stream), appended in the page: the
    reward plot's curves and eval line grow, and once the run stops, what the page built from deltas equals,
    trace by trace and point by point, what a Refresh draws whole."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    trainer, driver = Trainer(app.runs_dir), None
    try:
        with trainer:
            live = trainer.run_id
            driver = _driver(app.url + f"?tab=live&run={live}")
            wait = WebDriverWait(driver, 90, poll_frequency=0.2)
            wait.until(lambda d: f"Run #{live} run7" in d.find_element("id", "live-progress").text)
            # the page loads with two whole draws (the load's and the picker's change), which a first tick may
            # cross (its delta then extends the other one: the page asks for the panels whole, once); from
            # the first delta appended on, every tick appends to what the page holds
            count = "return [window.jaggView.extended, window.jaggView.resyncs]"
            wait.until(lambda d: d.execute_script(count)[0] >= 1)
            start, resyncs = driver.execute_script(count)
            first = driver.execute_script(HELD)["live-reward"]
            # three ticks that appended to the reward plot
            wait.until(lambda d: d.execute_script(count)[0] >= start + 3)
            grown = driver.execute_script(HELD)["live-reward"]
            assert grown["appended"], "the reward plot was drawn whole, not appended to"
            assert len(grown["traces"][0]["x"]) > len(first["traces"][0]["x"]), (first, grown)
            # a plot that holds another figure than the one last sent (two answers landed out of order), and
            # that no delta will reach (no metric it draws is logged): the next tick sends it whole
            driver.execute_script(STALE, "live-metrics")
            assert driver.execute_script(HELD)["live-metrics"]["notes"] == ["not the figure last sent"]
            wait.until(lambda d: d.execute_script(HELD)["live-metrics"]["rev"] != "0123456789abcdef")
            assert driver.execute_script(HELD)["live-metrics"]["notes"] != ["not the figure last sent"]
        # the run stopped: once ticks find nothing new, the page's plots are final. A whole draw beside the ticks
        # (the picker's change when another run's status changes) can still make one delta stale: the page then
        # asks for the panels whole, and on a busy machine that whole draw can be the last one. One more step
        # then gives the page a delta to end on (what is checked below is a page built from deltas).
        built = _settled(driver)
        for _ in range(3):
            if built["live-reward"]["appended"]:
                break
            extended = driver.execute_script(count)[0]
            with open_store(app.runs_dir) as store:
                trainer.log_one(store)
            wait.until(lambda d, n=extended: d.execute_script(count)[0] > n)
            built = _settled(driver)
        assert driver.execute_script(count)[1] <= resyncs + 5
        assert built["live-reward"]["appended"] and any(
            t["meta"] and t["meta"]["key"] == "eval/reward/mean" and len(t["meta"]["y"]) >= 2
            for t in built["live-reward"]["traces"]
        ), built["live-reward"]
        driver.find_element(By.XPATH, "//button[normalize-space()='Refresh']").click()
        wait.until(lambda d: not d.execute_script(HELD)["live-reward"]["appended"])
        time.sleep(0.5)
        # the page's own view applied to the whole draw too (it leaves out the points without a value, e.g. the
        # trailing mean's first steps, which the server's figure carries as gaps): the same curves either way
        driver.execute_script(
            "return window.jaggView.apply(['live-reward', 'live-metrics'], window.jaggView.read('live'))"
        )
        whole = driver.execute_script(HELD)
        assert set(built) == set(whole)
        for plot in whole:  # a failure says whether the curves differ or only the figure around them
            differs = _differs(built[plot]["traces"], whole[plot]["traces"])
            assert built[plot]["rev"] == whole[plot]["rev"] and differs is None, (
                plot, f"built {built[plot]['rev']} (appended: {built[plot]['appended']}, notes: {built[plot]['notes']})",
                f"whole {whole[plot]['rev']} (notes: {whole[plot]['notes']})", differs,
            )  # fmt: skip
    finally:
        if driver is not None:
            driver.quit()


# ---------------------------------------------------------------------------------------------- links and picks

PICKED_AT = """
window.jaggPickAt = null;
document.addEventListener('mousedown', (e) => {
  if (e.target.closest && e.target.closest('#live-run li')) window.jaggPickAt = performance.now();
}, true);
"""


def _mouse_pick(driver, run_id: int) -> None:
    """Open Live's run list with the mouse and click the run's option, as a user does."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def option(d):
        for li in d.find_elements(By.CSS_SELECTOR, "#live-run li"):
            if li.text.replace("\u2713", "").strip().startswith(f"#{run_id} "):
                return li
        return None

    ActionChains(driver).click(driver.find_element(By.CSS_SELECTOR, "#live-run input")).perform()
    ActionChains(driver).move_to_element(WebDriverWait(driver, 60).until(option)).click().perform()


LIVE_SHOWS = """
const p = document.querySelector('#live-progress'), log = document.querySelector('#live-log textarea');
const shown = (el) => !!el && getComputedStyle(el).visibility !== 'hidden';
return [shown(p) ? p.innerText : '', shown(log) ? log.value : ''];
"""


def test_a_run_picked_with_the_mouse_shows_its_panels_and_never_the_previous_runs(app):
    """Open a run's Live link, then pick other runs in the list with the mouse: each time the panels come back
    with the picked run's progress line and log (they stayed hidden behind the data before), and no frame
    after the click shows the previous run's."""
    driver = _driver(app.url + "?tab=live&run=3")
    try:
        until(
            driver,
            lambda d: "Run #3 run3" in d.execute_script(LIVE_SHOWS)[0],
            "run 3's Live link",
            state=LIVE_STATE,
            app=app,
        )
        for old, new in ((3, 4), (4, 5), (5, 3)):
            driver.execute_script(WATCH + PICKED_AT)
            _mouse_pick(driver, new)
            until(
                driver,
                lambda d, n=new: (
                    f"Run #{n} run{n}" in (s := d.execute_script(LIVE_SHOWS))[0] and f"log of run{n}" in s[1]
                ),
                f"run {new}'s panels, picked with the mouse after run {old}",
                state=LIVE_STATE,
                app=app,
            )
            picked = driver.execute_script("return window.jaggPickAt")
            assert picked is not None  # the click landed on the list's option
            seen = driver.execute_script("return window.jaggSeen")
            stale = [
                (round(t - picked), p[:30]) for t, p, log, _ in seen if t > picked and f"Run #{old} " in p
            ]
            assert not stale, (old, new, stale[:5])
            assert driver.execute_script("return document.querySelector('#live-run input').value").startswith(
                f"#{new} "
            )
    finally:
        driver.quit()


CHIPS = "return [...document.querySelectorAll('#compare-runs .token')].map(c => c.innerText)"
SELECTED_TAB = "const b = document.querySelector('button[role=tab][aria-selected=true]'); return b && b.innerText.trim();"
X_CHECKED = "const i = document.querySelector('#compare-x input:checked'); return i && i.value;"


def test_a_compare_link_opens_on_compare_with_its_axis_and_the_runs_labels_as_they_are_now(app):
    """A Compare link opened fresh (and reloaded) stays a Compare link on the Compare tab; the x radio names
    the axis the plots are drawn on, with or without ``x`` in the link; a run created after the app started,
    then finished, is named as it is now in the picker's chips."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with open_store(app.runs_dir) as store:
        cfg = {**TrainConfig().apply_overrides(["eval_every=5"]).to_dict(), "steps": 10, "strategy": "jagg"}
        late = store.create_run("late", cfg, None)
        for step in range(0, 11, 5):
            store.log_step(
                late, step, {"eval/reward/mean": 0.2 + 0.02 * step, "time/unix": time.time() + step}
            )
        store.set_status(late, "running", pid=None)
        store.set_status(late, "finished")
    drawn = "return !!((document.querySelector('#compare-plot .js-plotly-plot') || {})._fullData)"
    driver = _driver(app.url + f"?tab=compare&runs=3,{late}&x=step")
    try:
        wait = WebDriverWait(driver, 120, poll_frequency=0.2)
        for attempt in ("opened", "reloaded"):
            wait.until(
                lambda d: (
                    d.execute_script(drawn) and (d.execute_script(PLOT, "compare-plot") or {}).get("meta")
                )
            )
            wait.until(
                lambda d: any(c.startswith(f"#{late} late (jagg, finished)") for c in d.execute_script(CHIPS))
            )
            assert driver.execute_script(SELECTED_TAB) == "Compare", attempt
            query = driver.execute_script("return window.location.search")
            assert "tab=compare" in query and f"runs=3%2C{late}" in query and "tab=live" not in query, query
            assert driver.execute_script(X_CHECKED) == "step"
            assert driver.execute_script(PLOT, "compare-plot")["xtitle"] == "step"
            chips = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#compare-runs .token")]
            assert any(c.startswith(f"#{late} late (jagg, finished)") for c in chips), chips
            driver.refresh()
        driver.get(app.url + "?tab=compare&runs=3,4")  # no x: the radio says what the plots use
        wait.until(lambda d: (d.execute_script(PLOT, "compare-plot") or {}).get("meta"))
        title = driver.execute_script(PLOT, "compare-plot")["xtitle"]
        assert X_TITLES[driver.execute_script(X_CHECKED)] == title, title
    finally:
        driver.quit()


def test_a_link_opens_on_its_tab_with_no_server_call_answered(app):
    """With every server call blocked (Chromium drops gradio's queue/join), each link still opens on its tab:
    the page selects it from its own address, not after the server's load answers."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*queue/join*"]})
        for link, label in (("?tab=live&run=5", "Live"), ("?tab=compare&runs=3,4", "Compare"),
                            ("?run=5", "Live"), ("?tab=history", "History"), ("?tab=tryit", "Try it")):  # fmt: skip
            driver.get(app.url + link)
            WebDriverWait(driver, 120, poll_frequency=0.1).until(
                lambda d, label=label: d.execute_script(SELECTED_TAB) == label
            )
            progress = driver.execute_script(
                "return (document.querySelector('#live-progress') || {}).innerText || ''"
            )
            assert "Run #5 " not in progress  # nothing answered: the tab is the page's own doing
            if label == "Try it":  # its help says what the picker offers: the showcase's shipped model
                help_text = driver.execute_script("return document.querySelector('#tryit-run').innerText")
                assert "JAGG run ships its aligned model" in help_text and "ships none" not in help_text
    finally:
        driver.quit()


TOASTS = "return [...document.querySelectorAll('[data-testid=\"toast-body\"]')].map(t => t.innerText)"


def test_page_loads_beside_a_live_run_raise_no_slider_error(app):
    """Live links opened again and again beside a training run (its steps, with images, and a run without
    any): once each page has its run's images note, no error toast (gradio's "Value 12 is greater than
    maximum value 1" came from a newest step of the run before, put on the slider past the new run's bounds)."""
    from selenium.webdriver.support.ui import WebDriverWait

    with Trainer(app.runs_dir) as trainer:
        driver = _driver(app.url)
        try:
            wait = WebDriverWait(driver, 120, poll_frequency=0.1)
            for _ in range(4):
                for run, name in ((trainer.run_id, "run7"), (3, "run3")):
                    driver.get(app.url + f"?tab=live&run={run}")
                    wait.until(lambda d, r=run, n=name: f"Run #{r} {n}" in d.execute_script(LIVE_SHOWS)[0])
                    wait.until(lambda d: d.execute_script("return window.jaggView.latest") is not None)
                    wait.until(lambda d: "images" in d.execute_script(
                        "return (document.querySelector('#step-note') || {}).innerText || ''"))  # fmt: skip
                    toasts = driver.execute_script(TOASTS)
                    assert not toasts, (run, toasts)
        finally:
            driver.quit()
