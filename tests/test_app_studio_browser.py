"""The studio in headless Chromium: `python launch.py` over a runs folder the test writes itself (the shipped
showcase as runs #1–#2, then runs #3–#11 whose metrics, SDE window and eval images are written through the
store), so nothing trains and every check is about what the page shows.

Run #3 has 6 steps (eval at 0, 2, 4, 6), run #4 is an exact run of 4 steps (eval at 0, 2, 4); both log clock
times, so their curves have a wall-time axis.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from browser import ARTIFACTS, alert_open, chromium, live_app
from PIL import Image

from app import showcase
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig

pytestmark = pytest.mark.slow


def _eval_images(store, root: Path, run_id: int, step: int, shade: int) -> None:
    rows = []
    for prompt in ("a circle", "b square"):
        rel = f"samples/eval/step_{step:05d}/{prompt[0]}_seed0.png"
        path = root / f"run-{run_id:04d}" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), (shade, 40, 200 - shade)).save(path)
        rows.append({"kind": "eval", "prompt": prompt, "seed": 0, "reward": 0.1 * step, "path": rel})
    store.log_samples(run_id, step, rows)


def _fill(root: Path) -> None:
    with open_store(root) as store:
        assert showcase.install(store, root) == [1, 2]
        base = TrainConfig().apply_overrides(["eval_every=2"]).to_dict()
        for n in range(3, 12):
            steps, strategy = (6, "jagg") if n == 3 else (4, "exact" if n == 4 else "jagg")
            cfg = {**base, "steps": steps, "strategy": strategy, "output_dir": str(root.resolve())}
            run_id = store.create_run(f"run{n}", cfg, None)
            store.set_run_dir(run_id, root / f"run-{run_id:04d}")
            store.set_status(run_id, "running", pid=None)
            t0 = time.time() - 600
            for step in range(steps + 1):
                row = {"time/unix": t0 + 10 * step}
                if step:
                    row |= {"reward/mean": 0.1 * step, "loss/clipfrac": 0.05 * step, "grad/norm": 2.0 / step,
                            "time/step": 9.0, "sampler/window_start": step - 1, "sampler/window_end": step + 3}  # fmt: skip
                if step % 2 == 0 and n in (3, 4):
                    row["eval/reward/mean"] = 0.2 + 0.1 * step * (1.5 if strategy == "jagg" else 1.0)
                    _eval_images(store, root, run_id, step, 30 * step)
                store.log_step(run_id, step, row)
            store.set_status(run_id, "finished")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with live_app(tmp_path_factory, "studio", _fill) as live:
        yield live


def _open(app, tab: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    driver.get(app.url)
    xpath = f"//button[@role='tab' and normalize-space()='{tab}']"
    WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.XPATH, xpath))
    driver.find_element(By.XPATH, xpath).click()
    return driver


def _text(driver, elem_id: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, elem_id)
    return found[0].text if found else ""


def _plot(driver, elem_id: str) -> dict:
    """The plotly figure drawn in ``elem_id``: trace names, y values, the x axis's type and title."""
    return driver.execute_script(
        """
        const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
        if (!g || !g._fullData) return null;  // _fullData: the traces as drawn (arrays decoded)
        return {names: g._fullData.map(t => t.name), ys: g._fullData.map(t => Array.from(t.y || [])),
                xtype: g._fullLayout.xaxis.type, xtitle: (g._fullLayout.xaxis.title || {}).text};
        """,
        elem_id,
    )


def _choose(driver, elem_id: str, label: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//*[@id='{elem_id}']//label[normalize-space()='{label}']").click()


def test_browser_pickers_take_the_exact_run_a_doomed_action_asks_nothing_and_a_bad_pair_queues_nothing(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    with open_store(app.runs_dir) as store:
        assert [r["id"] for r in store.list_runs()] == list(range(11, 0, -1))  # runs #1–#11
    driver = _open(app, "Live")
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        wait.until(lambda d: "Run #11 " in _text(d, "live-progress"))  # the newest run is shown first
        box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("1")
        time.sleep(0.5)  # the list now holds #11, #10 and #1: each label contains "1"
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: "Run #1 " in _text(d, "live-progress"))
        time.sleep(2.5)  # a timer tick later it still shows run #1
        assert _text(driver, "live-progress").startswith("Run #1 showcase-exact"), _text(
            driver, "live-progress"
        )

        # Cancel of the read-only showcase: asked in the page at once, then refused in one line.
        driver.find_element(By.XPATH, "//button[normalize-space()='Cancel run']").click()
        wait.until(alert_open).accept()
        wait.until(lambda d: "Refused." in _text(d, "live-action-msg"))
        refused = _text(driver, "live-action-msg")
        assert refused == "Refused. cancel: run 1 is the shipped showcase, which is read-only", refused
        assert not [b for b in driver.find_elements(By.ID, "live-confirm") if b.is_displayed()]

        # Compare exact vs JAGG with probe_every=2: refused in one line, nothing queued.
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='New run']").click()
        overrides = driver.find_element(
            By.XPATH, "//label[.//*[normalize-space()='more settings (key=value, one a line)']]//textarea"
        )
        assert overrides.get_attribute("placeholder") == "sampling_steps=8\nprompts_per_step=4\neval_every=5"
        overrides.send_keys("probe_every=2")
        driver.find_element(By.XPATH, "//button[normalize-space()='Compare exact vs JAGG']").click()
        wait.until(lambda d: "Not launched" in d.page_source)
        refused = next(
            p.text for p in driver.find_elements(By.XPATH, "//p[contains(., 'Not launched')]") if p.text
        )
        assert refused == (
            "Not launched. the pair's exact run: probe_every: probes compare JAGG with exact; needs strategy "
            "jagg or endpoint"
        ), refused
    finally:
        driver.quit()
    with open_store(app.runs_dir) as store:
        assert len(store.list_runs()) == 11


def test_browser_compare_shows_the_picked_runs_only_with_wall_time_and_time_to_reach(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _open(app, "Compare")
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#showcase-curves .curve"))
        picker = driver.find_element(By.CSS_SELECTOR, "#compare-runs input")
        picker.click()
        for _ in range(2):  # the showcase's two chips
            picker.send_keys(Keys.BACKSPACE)
        for typed in ("3", "4", "99"):  # two runs and an id that names none
            picker.send_keys(typed)
            time.sleep(0.4)
            picker.send_keys(Keys.ENTER)
            time.sleep(0.4)
        chips = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#compare-runs .token")]
        assert chips == ["#3 run3 (jagg, finished)", "#4 run4 (exact, finished)", "99"], chips
        driver.find_element(By.ID, "compare-btn").click()
        wait.until(lambda d: "Not shown" in _text(d, "compare-msg"))
        message = _text(driver, "compare-msg")
        assert message.startswith("Not shown: runs: no run #99") and "\n" not in message, message
        wait.until(lambda d: (_plot(d, "compare-plot") or {}).get("names"))
        assert not driver.find_elements(By.ID, "showcase-curves")  # no showcase chart for other runs
        reward = _plot(driver, "compare-plot")
        assert {n.split(" · ")[0] for n in reward["names"]} == {"#3 jagg", "#4 exact"}, reward["names"]
        # the page opened on the showcase, on each run's training seconds: the axis stays until another is picked
        assert (reward["xtype"], reward["xtitle"]) == ("linear", "training time (s, evals excluded)")
        # each run at its own first and last eval: #3 at step 6, #4 at step 4, side by side
        captions = driver.execute_script(
            "return [...document.querySelectorAll('#compare-gallery .caption-label')].map(c => c.textContent)"
        )
        assert [c.split(" · ")[1] for c in captions[:4]] == ["step 0", "step 0", "step 6", "step 4"], captions
        rendering = driver.execute_script(
            "return getComputedStyle(document.querySelector('#compare-gallery img')).imageRendering"
        )
        assert rendering == "pixelated"
        # the time-to-reach row: the exact run's final eval (0.2 + 0.1 × 4 = 0.6), which #3 (0.2 + 0.15 × step)
        # first passes at its step-4 eval, after 4 × 9 s of training of its 6 × 9 s
        assert "Time to reach eval reward 0.6 (the lower of the final evals, #4 exact's)" in message
        reach = driver.find_element(By.ID, "compare-reach").text
        assert re.search(r"#3 jagg\s+4\s+36(\.0)?\s+67 %", reach), reach
        assert re.search(r"#4 exact\s+4\s+36(\.0)?\s+100 %", reach), reach
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-compare-time-to-reach.png"))

        _choose(driver, "compare-x", "wall time")
        wait.until(lambda d: (_plot(d, "compare-plot") or {}).get("xtype") == "date")
        assert _plot(driver, "compare-plot")["xtitle"] == "wall time"
        assert _plot(driver, "compare-metrics")["xtype"] == "date"
        time.sleep(1.0)
        driver.save_screenshot(str(ARTIFACTS / "app-compare-wall-time.png"))
    finally:
        driver.quit()


def test_browser_metrics_view_smoothing_wall_time_window_and_the_slider_following_a_new_eval(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _open(app, "Live")
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("2", Keys.ENTER)  # the showcase's JAGG run: trained by `jagg train`, a real run
        wait.until(lambda d: "Run #2 showcase-jagg" in _text(d, "live-progress"))

        def smoothed(d) -> list[float]:
            figure = _plot(d, "live-metrics") or {"names": [], "ys": []}
            return next((y for n, y in zip(figure["names"], figure["ys"]) if n == "grad/norm"), [])

        wait.until(lambda d: smoothed(d))
        names = _plot(driver, "live-metrics")["names"]
        assert {"loss/clipfrac", "grad/norm", "loss/clipfrac (raw)", "grad/norm (raw)"} <= set(names), names
        before = smoothed(driver)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-metrics-view.png"))
        number = driver.find_element(By.CSS_SELECTOR, "#live-smoothing input[type='number']")
        number.send_keys(Keys.CONTROL, "a")
        number.send_keys("0.95", Keys.ENTER)
        wait.until(lambda d: smoothed(d) and smoothed(d) != before)
        assert (
            len(smoothed(driver)) == len(before) and smoothed(driver)[0] == before[0]
        )  # debiased: same start
        _choose(driver, "live-x", "wall time")
        wait.until(lambda d: (_plot(d, "live-metrics") or {}).get("xtype") == "date")
        assert _plot(driver, "live-reward")["xtype"] == "date"  # the reward curve against wall time too

        # The window position of a run that logged it (run #3: one step later each step).
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("3", Keys.ENTER)
        wait.until(lambda d: "Run #3 run3" in _text(d, "live-progress"))
        wait.until(lambda d: (_plot(d, "live-window") or {}).get("ys"))
        window = _plot(driver, "live-window")
        assert window["ys"] == [[0, 1, 2, 3, 4, 5], [4, 5, 6, 7, 8, 9]], window

        # A running run: the slider sits on its newest step and follows an eval that arrives later.
        with open_store(app.runs_dir) as store:
            live = store.create_run("live", {**TrainConfig().to_dict(), "steps": 4}, None)
            store.set_run_dir(live, app.runs_dir / f"run-{live:04d}")
            store.set_status(live, "running", pid=None)
            _eval_images(store, app.runs_dir, live, 2, 10)
            store.log_step(live, 2, {"reward/mean": 0.2})
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(live), Keys.ENTER)
        wait.until(lambda d: "at step 2 (logged" in _text(d, "step-note"))
        first = driver.find_element(By.CSS_SELECTOR, "#step-gallery img").get_attribute("src")
        with open_store(app.runs_dir) as store:
            _eval_images(store, app.runs_dir, live, 4, 250)
            store.log_step(live, 4, {"reward/mean": 0.4})
        wait.until(lambda d: "at step 4 (logged at steps 2, 4)" in _text(d, "step-note"))
        slider = driver.find_element(By.CSS_SELECTOR, "#step-slider input[type='number']").get_attribute(
            "value"
        )
        newest = driver.find_element(By.CSS_SELECTOR, "#step-gallery img").get_attribute("src")
        assert slider == "4" and newest != first
        driver.save_screenshot(str(ARTIFACTS / "app-slider-follows.png"))
    finally:
        driver.quit()
