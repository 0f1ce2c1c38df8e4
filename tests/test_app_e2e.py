"""The app end to end: `python launch.py` in a subprocess driven by gradio_client and by a headless Chromium,
with the real trainer (`jagg train --run-id`) behind it.

One app serves the module over a fresh runs folder: the first test sees it as a visitor's browser first does
(the shipped showcase on the Compare tab), the next restarts it while a run trains. The tiny-shapes backbone is used
when its pretrained weights are in assets/; until then the randomly initialised tiny-flux with the
brightness reward stands in (same trainer, same metrics and samples).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from api_client import local_client
from browser import ARTIFACTS, chromium
from polling import wait_for

from jagg_engine.backbones.tiny_shapes import DEFAULT_WEIGHTS_DIR
from jagg_engine.cost import cost_model_speedup
from jagg_engine.store import open_store, pid_alive

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY_SHAPES_READY = (DEFAULT_WEIGHTS_DIR / "transformer" / "config.json").exists()
BACKBONE, REWARDS = (
    ("tiny-shapes", "shapes-dense: 1") if TINY_SHAPES_READY else ("tiny-flux", "brightness: 1")
)
# A run of a few seconds a step on 2 CPU cores: 2 prompts × 4 samples, 6 sampling steps (all trained, one
# window of 4 plus a partial one), eval of 4 prompts × 1 seed at step 0 and every `eval_every` steps.
SHORT = "prompts_per_step=2\nsampling_steps=6\neval_num_prompts=4\neval_seeds=[0]\nsample_every=0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveApp:
    """`python launch.py --port P --runs-dir D` as a child process (own session), restartable."""

    def __init__(self, runs_dir: Path, tmp: Path):
        self.runs_dir, self.tmp = runs_dir, tmp
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 90.0) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/"
        env = {
            **os.environ,
            "GRADIO_ANALYTICS_ENABLED": "False",
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "GRADIO_TEMP_DIR": str(self.tmp / "gradio"),
        }
        env.pop("SPACE_ID", None)
        self.log = (self.tmp / f"app-{port}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "launch.py"), "--port", str(port), "--runs-dir", str(self.runs_dir)],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"the app exited: {self.read_log()}"
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"the app did not answer in {timeout} s: {self.read_log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def read_log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in self.tmp.glob("app-*.log"))

    def client(self):
        return local_client(self.url, download_files=str(self.tmp / "downloads"))


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("app-e2e")
    live = LiveApp(tmp / "runs", tmp)
    live.start()
    yield live
    live.stop()
    from app.runs import RunManager

    manager = RunManager(tmp / "runs")  # stop any trainer a failed test left behind
    for run in manager.store.list_runs():
        if run["status"] in ("queued", "running") and run["pid"]:
            manager.kill(run["id"])
    manager.shutdown()


def _form(**changes):
    form = {
        "name": "e2e",
        "backbone": BACKBONE,
        "model_path": "",
        "rewards": REWARDS,
        "algorithm": "flow-grpo",
        "window": 4,
        "jagg_frac": 1.0,
        "cv_frac": 0.0,
        "jagg_until_step": 0,
        "strategy": "jagg",
        "steps": 3,
        "group_size": 4,
        "lr": 1e-4,
        "seed": 0,
        "processes": 1,
        "overrides": SHORT + "\neval_every=3",
    }
    form.update(changes)
    return list(form.values())


def _array(value) -> list:
    """A plotly JSON array: a list, or {"dtype", "bdata"} (base64 of the raw buffer)."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


def _history(client) -> dict[int, dict]:
    table = client.predict(api_name="/history")
    return {row[0]: dict(zip(table["headers"], row)) for row in table["data"]}


def _wait_mid_run(client, run_id: int, timeout: float, last: float = 1.0) -> dict:
    """Poll the history (every 0.1 s: the default's test steps take well under a second) until the run is
    running at a step k with 1 <= k <= last·N; fail at once if it finished, failed or went past that."""
    deadline = time.time() + timeout
    row: dict = {}
    while time.time() < deadline:
        row = _history(client).get(run_id, {})
        # "k/N", and while it trains " · s/step · ETA"
        match = re.match(r"(\d+)/(\d+)(?: · |$)", str(row.get("step") or ""))
        done, total = (int(match[1]), int(match[2])) if match else (0, 1)
        if row.get("status") not in (None, "queued", "running") or done > last * total:
            break
        if done >= 1:
            return row
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} was not caught between step 1 and {last:.0%} of its steps: {row}")


def _wait_status(client, run_id: int, statuses: tuple[str, ...], timeout: float) -> dict:
    deadline = time.time() + timeout
    row: dict = {}
    while time.time() < deadline:
        row = _history(client).get(run_id, {})
        if row.get("status") in statuses:
            return row
        time.sleep(1.0)
    raise AssertionError(f"run {run_id} did not reach {statuses} in {timeout} s: {row}")


def _chromium():
    return chromium("1400,2400")


def test_browser_fresh_app_opens_on_the_showcase_comparison(app):
    """Both runs' reward curves and at least 4 image pairs, with no run trained, drawn from the page's own
    config (no server call between the page's load and them: how fast is scripts/bench_ui.py's figure)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    history = _history(app.client())
    assert sorted(r["name"] for r in history.values()) == ["showcase-exact", "showcase-jagg"], history
    driver = _chromium()
    try:
        driver.get(app.url)  # returns at the page's load event

        def shown(d) -> bool:
            legend = " ".join(
                e.get_attribute("data-run")
                for e in d.find_elements(By.CSS_SELECTOR, "#showcase-curves .curve")
            )
            images = d.find_elements(By.CSS_SELECTOR, "#compare-gallery img")
            decoded = d.execute_script(
                "return [...document.querySelectorAll('#compare-gallery img')]"
                ".filter(i => i.complete && i.naturalWidth > 0).length"
            )
            return "exact" in legend and "jagg" in legend and len(images) >= 8 and decoded >= 8

        WebDriverWait(driver, 120, poll_frequency=0.1).until(shown)
        # the curves and the gallery are the components' values in the config the page is served with
        initial = driver.execute_script(
            "const c = window.gradio_config.components;"
            "const v = (id) => (c.find(x => x.props && x.props.elem_id === id) || {props: {}}).props.value;"
            "return [String(v('showcase-curves') || ''), (v('compare-gallery') || []).length];"
        )
        assert initial[0].count('class="curve"') >= 4 and initial[1] >= 8, initial[1]
        traces = driver.find_elements(By.CSS_SELECTOR, "#showcase-curves .curve")
        names = [
            img.get_attribute("src").rsplit("/", 1)[-1]
            for img in driver.find_elements(By.CSS_SELECTOR, "#compare-gallery img")
        ]
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-showcase.png"))
        assert len(traces) >= 4  # per run at least its training reward line and its eval line
        # Rows of 4: exact and JAGG at the first eval, then at the last, all of one prompt and seed.
        rows = [names[i : i + 4] for i in range(0, 16, 4)]
        assert all(len(set(row)) == 1 and row[0].endswith(".png") for row in rows), names[:16]
        assert (ARTIFACTS / "app-showcase.png").stat().st_size > 10_000
    finally:
        driver.quit()


def test_launch_restart_finish_and_cancel_through_the_api(app):
    client = app.client()
    showcase = set(_history(client))
    message, run_id, _ = client.predict(*_form(window=1), api_name="/launch_run")
    assert (
        message.startswith("**Not launched.**")
        and "W (window): must be an integer >= 2 for strategy jagg (a one-step window trains with strategy=exact),"
        " got 1"
        in message
    )
    message, pair_id, _ = client.predict(*_form(group_size=1), api_name="/compare_exact_jagg")
    assert (
        message.startswith("**Not launched.**")
        and "group size (group_size): must be an integer >= 2, got 1" in message
    )
    assert run_id is None and pair_id is None and set(_history(client)) == showcase, (
        "an invalid form launched"
    )

    message, run_id, _ = client.predict(*_form(), api_name="/launch_run")
    # the launched id's box is a gr.Textbox (app/layout.py): the API returns the id as its digits
    assert message.startswith(f"Run #{run_id} ") and isinstance(run_id, str) and run_id.isdigit(), message
    run_id = int(run_id)
    row = _wait_status(client, run_id, ("finished", "failed"), 240)
    assert row["status"] == "finished", f"{row}\n{app.read_log()}"
    assert row["step"] == "3/3" and row["final reward"] is not None

    # the progress line, then the Live panels in registration order (app/panels.py)
    progress_text, reward, times, speedup, counts, probes, gallery, log, memory, seconds, *_ = client.predict(
        run_id, 1.8, api_name="/live_view"
    )
    assert "3/3" in progress_text and "finished" in progress_text
    traces = json.loads(reward["plot"])["data"]
    names = [t["name"] for t in traces]
    assert "total" in names and "eval" in names
    total = next(t for t in traces if t["name"] == "total")
    assert _array(total["x"]) == [1, 2, 3]
    assert [t["name"] for t in json.loads(times["plot"])["data"]] == [
        "sampling", "reward", "probe", "update forward", "update backward",
    ]  # fmt: skip
    # predicted for the default window (the first W = 4 of the 6 steps, trained every step), r = 1.8, with the
    # rollout's velocities (reuse_rollout_velocity auto, one update a rollout): one group of 4 → 4r / 2r
    predicted = cost_model_speedup(4, 1.8, 1.0, "jagg+reuse", trained_steps=4)
    shown = dict(zip(speedup["headers"], speedup["data"][0]))
    assert predicted == pytest.approx(2.0)
    assert shown["predicted speedup"] == pytest.approx(predicted, abs=1e-3), shown
    assert shown["predicted over"] == "exact backward over the same 4 trained steps", shown
    # the first eval only (4 prompts × 1 seed at step 0): the step slider shows the newest step's images
    assert len(gallery) == 4 and all(item["caption"].startswith("step 0 · ") for item in gallery), gallery
    first = gallery[0]
    assert "reward" in first["caption"]
    assert Path(first["image"]).stat().st_size > 0
    assert "step 3" in log
    # the trainer logs the process's resident set size each step (no GPU here: no peak CUDA memory)
    rss = next(t for t in json.loads(memory["plot"])["data"] if t["name"] == "process RSS")
    assert _array(rss["x"]) == [1, 2, 3] and all(0.01 < gib < 64 for gib in _array(rss["y"]))
    assert [t["name"] for t in json.loads(seconds["plot"])["data"]] == ["training step", "update phase"]

    # A second run; the app restarts while it trains, then it is cancelled from the new app.
    _, second, _ = client.predict(*_form(name="to-cancel", steps=50), api_name="/launch_run")
    second = int(second)
    _wait_mid_run(client, second, 120, last=0.5)
    with open_store(app.runs_dir) as store:
        trainer_pid = store.get_run(second)["pid"]
    app.stop()
    assert pid_alive(trainer_pid), "the run died with the app"
    assert os.getpgid(trainer_pid) == trainer_pid, "the trainer is not in its own process group"
    app.start()
    client = app.client()
    history = _history(client)
    assert history[run_id]["status"] == "finished" and history[second]["status"] == "running", history
    progress_text = client.predict(second, 1.8, api_name="/live_view")[0]
    assert (
        f"Run #{second} to-cancel" in progress_text and "running" in progress_text and "/50" in progress_text
    )

    answer = client.predict(second, api_name="/cancel_run")
    assert "stop requested" in answer, answer
    row = _wait_status(client, second, ("cancelled", "failed", "finished"), 90)
    assert row["status"] == "cancelled", row
    assert wait_for(lambda: not pid_alive(trainer_pid), 30), "the cancelled trainer is still alive"

    # Compare and export read the same history.
    # (message, reward, metrics, time to reach, summary, diff, images, metric choices: the showcase box is layout)
    _, plot, _, _, table, diff, images, _ = client.predict([run_id, second], 1.8, api_name="/compare_runs")
    assert len(table["data"]) == 2
    diff_fields = [r[0] for r in diff["data"]]
    assert "name" in diff_fields and "steps" in diff_fields and "window" not in diff_fields
    message, files = client.predict(run_id, api_name="/export_run")
    assert sorted(Path(f).suffix for f in files) == [".csv", ".json"]

    # Delete the cancelled run with its folder; the finished one stays.
    folder = app.runs_dir / f"run-{second:04d}"
    assert folder.is_dir()
    message, _ = client.predict(second, True, api_name="/delete_run")
    assert "deleted with its folder" in message, message
    assert not folder.exists() and set(_history(client)) == {run_id} | showcase


def test_browser_launch_shows_reward_plot_and_samples(app):
    driver = _chromium()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        driver.get(app.url)
        wait = WebDriverWait(driver, 60)
        wait.until(
            lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='New run']")
        )
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='New run']").click()
        wait.until(lambda d: d.find_elements(By.XPATH, "//button[normalize-space()='Launch']"))

        def field(label: str):
            return driver.find_element(
                By.XPATH, f"//label[.//*[normalize-space()='{label}']]//*[self::input or self::textarea]"
            )

        for label, value in (("name", "browser"), ("steps", "2")):
            box = field(label)
            box.clear()
            box.send_keys(value)
        if BACKBONE != "tiny-shapes":  # no pretrained tiny-shapes weights yet: set the stand-in as overrides
            extra = f"backbone={BACKBONE}\nrewards={{{REWARDS}}}\n"
        else:
            extra = ""
        field("more settings (key=value, one a line)").send_keys(extra + SHORT + "\neval_every=2")
        # An invalid value is refused inline with the config's message, and nothing launches.
        assert (
            "Predicted update-phase speedup over exact backward over the same trained steps: <strong>2.00×"
            in driver.page_source
        )  # 7.2 / 3.6
        window = field("W (window)")
        window.clear()
        window.send_keys("1")
        driver.find_element(By.XPATH, "//button[normalize-space()='Launch']").click()
        wait.until(lambda d: "Not launched" in d.page_source)
        assert (
            "W (window): must be an integer &gt;= 2 for strategy jagg (a one-step window trains with strategy=exact), got 1"
            in driver.page_source
        )
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-new-run-error.png"))
        window.clear()
        window.send_keys("4")
        driver.find_element(By.XPATH, "//button[normalize-space()='Launch']").click()
        # the launch's own reply replaces the refusal (the page holds "Run #" elsewhere too: read the message;
        # its textContent, as the page moves to Live at once and hides the New-run tab)
        wait.until(lambda d: "Run #" in d.find_element(By.ID, "launch-msg").get_attribute("textContent"))
        said = driver.find_element(By.ID, "launch-msg").get_attribute("textContent")
        assert "Not launched" not in said and ("started" in said or "queued" in said), said
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Live']").click()

        # The timer refreshes the live view: the reward plot draws a line, the gallery shows eval images.
        long_wait = WebDriverWait(driver, 240, poll_frequency=1.0)
        long_wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#live-reward .scatterlayer .trace"))
        long_wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#live-gallery img[src*='_seed']"))
        long_wait.until(lambda d: "2/2" in d.page_source and "finished" in d.page_source)
        time.sleep(2.0)  # let the last refresh paint
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-live.png"))
        assert (ARTIFACTS / "app-live.png").stat().st_size > 10_000
    finally:
        driver.quit()
        shutil.rmtree(app.tmp / "downloads", ignore_errors=True)


# ---------------------------------------------------------------------------------------------- run management
# One run of 4 steps (eval at steps 0, 2 and 4) is launched and cancelled after its first step; the browser
# resumes it from the Live tab, then moves the step slider over its eval images and duplicates it.


def _driver_on_live(app, run_id: int):
    """A browser on the Live tab with ``run_id`` picked (the page picks the newest run; else typed in)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _chromium()
    driver.get(app.url)
    wait = WebDriverWait(driver, 60)
    tab = "//button[@role='tab' and normalize-space()='Live']"
    wait.until(lambda d: d.find_elements(By.XPATH, tab))
    driver.find_element(By.XPATH, tab).click()
    wait.until(lambda d: "Run #" in d.find_element(By.ID, "live-progress").text)
    if f"Run #{run_id} " not in driver.find_element(By.ID, "live-progress").text:
        box = driver.find_element(By.XPATH, "//label[.//*[normalize-space()='run']]//input")
        box.clear()
        box.send_keys(str(run_id), Keys.ENTER)
        wait.until(lambda d: f"Run #{run_id} " in d.find_element(By.ID, "live-progress").text)
    return driver


@pytest.fixture(scope="module")
def cancelled_run(app) -> int:
    client = app.client()
    overrides = (
        SHORT.replace("eval_num_prompts=4", "eval_num_prompts=2") + "\neval_every=2\ncheckpoint_every=1"
    )
    message, run_id, _ = client.predict(
        *_form(name="manage", steps=8, lr=1e-3, group_size=2, overrides=overrides), api_name="/launch_run"
    )
    assert isinstance(run_id, str) and run_id.isdigit(), message
    run_id = int(run_id)
    _wait_mid_run(client, run_id, 180, last=0.5)
    assert "stop requested" in client.predict(run_id, api_name="/cancel_run")
    row = _wait_status(client, run_id, ("cancelled", "finished", "failed"), 90)
    assert row["status"] == "cancelled" and row["step"] != "8/8", row
    return run_id


def test_browser_resume_finishes_a_cancelled_run(app, cancelled_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver_on_live(app, cancelled_run)
    try:
        assert "cancelled" in driver.find_element(By.ID, "live-progress").text
        driver.find_element(By.XPATH, "//button[normalize-space()='Resume run']").click()
        WebDriverWait(driver, 30).until(  # it asks first, naming the run
            lambda d: (
                f"Resume run #{cancelled_run} manage (cancelled)?"
                in d.find_element(By.ID, "live-confirm-question").text
            )
        )
        driver.find_element(By.ID, "live-confirm").click()
        WebDriverWait(driver, 30).until(
            lambda d: "resuming from its last checkpoint" in d.find_element(By.ID, "live-action-msg").text
        )
        progress = lambda d: d.find_element(By.ID, "live-progress").text  # noqa: E731
        WebDriverWait(driver, 240, poll_frequency=1.0).until(lambda d: "finished" in progress(d))
        assert "step 8/8" in progress(driver), progress(driver)
        time.sleep(2.0)  # let the last refresh paint
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-resume.png"))
    finally:
        driver.quit()
    row = _history(app.client())[cancelled_run]
    assert (row["status"], row["step"]) == ("finished", "8/8"), row


def _first_image(driver) -> tuple[str, bytes]:
    """The step gallery's first image: its file name and its bytes (fetched from the app)."""
    from selenium.webdriver.common.by import By

    src = driver.find_element(By.CSS_SELECTOR, "#step-gallery img").get_attribute("src")
    with urllib.request.urlopen(src, timeout=10) as resp:
        return src.rsplit("/", 1)[-1], resp.read()


def test_browser_step_slider_changes_the_image_of_one_prompt_and_seed(app, cancelled_run):
    import io

    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    assert _wait_status(app.client(), cancelled_run, ("finished", "failed"), 240)["status"] == "finished"
    driver = _driver_on_live(app, cancelled_run)
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.5)
        note = lambda d: d.find_element(By.ID, "step-note").text  # noqa: E731
        wait.until(lambda d: "at step 8 (logged at steps 0, 2, 4, 6, 8)" in note(d))
        last_name, last = _first_image(driver)
        number = driver.find_element(By.CSS_SELECTOR, "#step-slider input[type='number']")
        number.send_keys(Keys.CONTROL, "a")
        number.send_keys("0", Keys.ENTER)
        wait.until(lambda d: "at step 0 (logged" in note(d))
        wait.until(lambda d: _first_image(d)[1] != last)
        first_name, first = _first_image(driver)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-step-slider.png"))
    finally:
        driver.quit()
    assert first_name == last_name and first_name.endswith("_seed0.png")  # the same prompt and seed
    a, b = (np.asarray(Image.open(io.BytesIO(x)).convert("RGB"), dtype=float) for x in (first, last))
    assert np.abs(a - b).mean() > 0, "step 0 and step 8 show the same picture"


def test_browser_duplicate_with_one_changed_field_launches_exactly_that_diff(app, cancelled_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver_on_live(app, cancelled_run)
    try:
        wait = WebDriverWait(driver, 60)
        driver.find_element(By.XPATH, "//button[normalize-space()='Duplicate']").click()
        overrides = "//label[.//*[normalize-space()='more settings (key=value, one a line)']]//textarea"
        wait.until(
            lambda d: "checkpoint_every=1" in d.find_element(By.XPATH, overrides).get_attribute("value")
        )
        steps = driver.find_element(By.XPATH, "//label[.//*[normalize-space()='steps']]//input")
        assert steps.get_attribute("value") == "8"
        steps.clear()
        steps.send_keys("2")
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-duplicate.png"))
        driver.find_element(By.XPATH, "//button[normalize-space()='Launch']").click()
        wait.until(
            lambda d: "Run #" in d.page_source and ("started" in d.page_source or "queued" in d.page_source)
        )
    finally:
        driver.quit()
    client = app.client()
    new_id = max(_history(client))
    assert new_id != cancelled_run
    client.predict(new_id, api_name="/cancel_run")  # the diff is what this test checks, not the training
    with open_store(app.runs_dir) as store:
        old, new = store.get_run(cancelled_run)["config"], store.get_run(new_id)["config"]
    assert {k: (old[k], new[k]) for k in old | new if old.get(k) != new.get(k)} == {"steps": (8, 2)}
    _wait_status(client, new_id, ("cancelled", "finished", "failed"), 90)
