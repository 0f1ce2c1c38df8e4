"""No HTML from users, in headless Chromium: runs named (and noted, prompted, failed) with an image and a
link of a visitor's making, then every component that renders Markdown or HTML is walked: the Live progress
line, the Cancel and Resume questions, Compare's message, tables and gallery, History's table and its Delete
and Resume questions, and error lines that echo what was typed. No <img> or <a> element may come from the
hostile text, and a local HTTP server that counts requests must see none (its image is never fetched).
"""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest
from browser import alert_open, chromium, live_app
from PIL import Image

from app import notes
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig

pytestmark = pytest.mark.slow


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Counter.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def trap():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def hostile(port: int) -> str:
    return f"<img src=//127.0.0.1:{port}/t.png>[Owner login](/x)![i](//127.0.0.1:{port}/m.png)`tick`"


def _fill(root: Path, port: int) -> None:
    name = hostile(port)
    with open_store(root) as store:
        base = TrainConfig().apply_overrides(["eval_every=2"]).to_dict()
        for strategy in ("exact", "jagg"):
            cfg = {**base, "steps": 2, "strategy": strategy, "output_dir": str(root.resolve())}
            run_id = store.create_run(name, cfg, None)
            run_dir = root / f"run-{run_id:04d}"
            store.set_run_dir(run_id, run_dir)
            store.set_status(run_id, "running", pid=None)
            t0 = time.time() - 60
            for step in range(3):
                row = {"time/unix": t0 + 10 * step, "eval/reward/mean": 0.2 + 0.1 * step}
                if step:
                    row |= {"reward/mean": 0.1 * step, "time/step": 9.0}
                store.log_step(run_id, step, row)
                rel = f"samples/eval/step_{step:05d}/a_seed0.png"
                (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (16, 16), (40 * step, 40, 90)).save(run_dir / rel)
                store.log_samples(run_id, step, [{"kind": "eval", "prompt": name, "seed": 0, "reward": 0.1,
                                                  "path": rel}])  # fmt: skip
            store.set_status(run_id, "failed" if strategy == "exact" else "finished", error=name)
            notes.set_note(root, run_id, name)
        # run #3 "trains" (its row says so; no trainer): a Cancel of it asks, naming it
        cfg = {**base, "steps": 2, "strategy": "jagg", "output_dir": str(root.resolve())}
        run_id = store.create_run(name, cfg, None)
        store.set_run_dir(run_id, root / f"run-{run_id:04d}")
        store.set_status(run_id, "running", pid=None)
        store.log_step(run_id, 0, {"time/unix": time.time(), "eval/reward/mean": 0.2})


@pytest.fixture(scope="module")
def app(tmp_path_factory, trap):
    with live_app(tmp_path_factory, "escape", lambda runs: _fill(runs, trap)) as live:
        yield live


def _made_elements(driver, port: int) -> list[str]:
    """Every <img> whose source, and every <a> whose text or link, comes from the hostile text."""
    return driver.execute_script(
        """
        const port = String(arguments[0]), out = [];
        for (const img of document.querySelectorAll('img')) {
          const src = img.getAttribute('src') || '';
          if (src.includes(port) || src.endsWith('t.png') || src.endsWith('m.png')) out.push(img.outerHTML);
        }
        for (const a of document.querySelectorAll('a')) {
          const href = a.getAttribute('href') || '';
          if (a.textContent.includes('Owner login') || href === '/x' || href.includes(port)) out.push(a.outerHTML);
        }
        for (const c of document.querySelectorAll('code')) {
          if (c.textContent === 'tick') out.push(c.outerHTML);
        }
        return out;
        """,
        port,
    )


def _text(driver, elem_id: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, elem_id)
    return found[0].text if found else ""


def _tab(driver, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//button[@role='tab' and normalize-space()='{name}']").click()


def test_browser_hostile_run_names_render_as_text_everywhere(app, trap):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    name = hostile(trap)
    literal = f"<img src=//127.0.0.1:{trap}/t.png>[Owner login](/x)"  # how the text reads on the page
    driver = chromium("1400,2400")
    checked = []

    def clean(where: str) -> None:
        made = _made_elements(driver, trap)
        assert not made, f"{where}: {made}"
        checked.append(where)

    def asks_and_keep(button: str, asked: str, prefix: str, where: str) -> None:
        """``button`` asks a question that starts with ``asked`` and names the run as typed; Keep answers."""
        driver.find_element(By.XPATH, f"//button[normalize-space()='{button}']").click()
        wait.until(lambda d: _text(d, f"{prefix}-confirm-question").startswith(asked))
        question = _text(driver, f"{prefix}-confirm-question")
        assert literal in question, question
        clean(where)
        driver.find_element(By.ID, f"{prefix}-keep").click()

    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        driver.get(app.url)
        wait.until(lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='Live']"))
        _tab(driver, "Live")
        wait.until(lambda d: "Run #" in _text(d, "live-progress"))  # the showcase (#4, #5) opens first
        box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("2", Keys.ENTER)
        # run #2: the progress line names it as typed
        wait.until(lambda d: literal in _text(d, "live-progress"))
        clean("Live progress line and panels")
        # the finished run #2 is neither cancelled nor resumed: Cancel asks in the page (the browser's own
        # question, at once), then is refused in one line; Resume is refused before any question
        driver.find_element(By.XPATH, "//button[normalize-space()='Cancel run']").click()
        wait.until(alert_open).accept()
        wait.until(lambda d: _text(d, "live-action-msg").startswith("Refused. run 2: is already finished"))
        assert not [b for b in driver.find_elements(By.ID, "live-confirm") if b.is_displayed()]
        clean("Live Cancel refusal")
        refusal = "Refused. run 2: is finished; only a failed or cancelled run resumes"
        driver.find_element(By.XPATH, "//button[normalize-space()='Resume run']").click()
        wait.until(lambda d: _text(d, "live-confirm-question").startswith(refusal))
        assert not [b for b in driver.find_elements(By.ID, "live-confirm") if b.is_displayed()]
        clean("Live Resume refusal")
        # the failed run #1 (its error shown verbatim) and the training run #3: Resume and Cancel ask, naming
        # the run as typed; Keep does nothing
        for number, status, verb in ((1, "failed", "Resume"), (3, "", "Cancel")):
            box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
            box.click()
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(str(number), Keys.ENTER)
            wait.until(lambda d, n=number, s=status: f"Run #{n} " in _text(d, "live-progress")
                       and s in _text(d, "live-progress"))  # fmt: skip
            if status:
                clean(f"Live progress line of a {status} run")
            if verb == "Cancel":  # the page's own question names the run as the picker shows it, as text
                driver.find_element(By.XPATH, "//button[normalize-space()='Cancel run']").click()
                alert = wait.until(alert_open)
                asked = alert.text
                alert.dismiss()
                assert asked.startswith(f"Cancel run #{number} ") and literal in asked, asked
                clean("Live Cancel question")
            else:
                asks_and_keep(f"{verb} run", f"{verb} run #{number} ", "live", f"Live {verb} question")
            wait.until(lambda d: "Nothing done." in _text(d, "live-action-msg"))
        # a picker that names no run: the typed text echoed in one line
        box = driver.find_element(By.CSS_SELECTOR, "#live-run input")
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(name, Keys.ENTER)
        time.sleep(3)
        clean("Live picker's error line")

        _tab(driver, "Compare")
        picker = driver.find_element(By.CSS_SELECTOR, "#compare-runs input")
        picker.click()
        for _ in range(2):  # the showcase's two chips
            picker.send_keys(Keys.BACKSPACE)
        for typed in ("1", "2"):
            picker.send_keys(typed)
            time.sleep(0.4)
            picker.send_keys(Keys.ENTER)
            time.sleep(0.4)
        level = driver.find_element(By.CSS_SELECTOR, "#compare-level input, #compare-level textarea")
        level.send_keys(name)
        driver.find_element(By.ID, "compare-btn").click()
        wait.until(lambda d: "reward level" in _text(d, "compare-msg"))
        assert "Owner login" in _text(driver, "compare-msg"), _text(driver, "compare-msg")
        clean("Compare's error line echoing the reward level")
        level.send_keys(Keys.CONTROL, "a")
        level.send_keys(Keys.BACKSPACE)
        driver.find_element(By.ID, "compare-btn").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-gallery .caption-label"))
        time.sleep(1)
        clean("Compare's message, plots, tables and gallery")
        driver.find_element(By.XPATH, "//button[normalize-space()='Report (HTML)']").click()
        wait.until(lambda d: "written" in d.page_source or "Error" in d.page_source)
        clean("Compare's report line")

        _tab(driver, "History")
        wait.until(lambda d: literal in _text(d, "history-table"))
        clean("History table (names, notes, errors)")
        search = driver.find_element(By.CSS_SELECTOR, "#history-search input, #history-search textarea")
        search.send_keys(name, Keys.ENTER)
        time.sleep(2)
        clean("History search")
        target = driver.find_element(By.CSS_SELECTOR, "#history-target input")
        target.send_keys("2")
        resume = "Refused. run 2: is finished; only a failed or cancelled run resumes"
        driver.find_element(By.XPATH, "//button[normalize-space()='Resume']").click()
        wait.until(lambda d: _text(d, "history-confirm-question").startswith(resume))
        clean("History Resume refusal")
        # Delete of the finished #2 and Resume of the failed #1 ask, naming the run as typed
        for button, number in (("Delete", 2), ("Resume", 1)):
            target.send_keys(Keys.CONTROL, "a")
            target.send_keys(str(number))
            asks_and_keep(button, f"{button} run #{number} ", "history", f"History {button} question")
            time.sleep(1)
        time.sleep(1)  # an image the page asked for would have reached the counter by now
    finally:
        driver.quit()
    assert _Counter.hits == [], f"requests from the hostile text: {_Counter.hits}"
    assert len(checked) == 15, checked
    with open_store(app.runs_dir) as store:  # Keep deleted nothing
        assert len(store.list_runs()) == 5  # the three hostile runs and the showcase's two
        assert store.get_run(3)["status"] == "running" and not store.get_run(3)["cancel_requested"]


def test_browser_report_appears_as_a_download_link(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        driver.get(app.url)
        wait.until(
            lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='Compare']")
        )
        _tab(driver, "Compare")
        assert not [e for e in driver.find_elements(By.ID, "compare-report") if e.is_displayed()]
        picker = driver.find_element(By.CSS_SELECTOR, "#compare-runs input")
        picker.click()
        for _ in range(2):  # the showcase's two chips
            picker.send_keys(Keys.BACKSPACE)
        for typed in ("1", "2"):
            picker.send_keys(typed)
            time.sleep(0.4)
            picker.send_keys(Keys.ENTER)
            time.sleep(0.4)
        driver.find_element(By.XPATH, "//button[normalize-space()='Report (HTML)']").click()

        def link(d):
            found = d.find_elements(By.CSS_SELECTOR, "#compare-report a[href]")
            named = [a for a in found if a.get_attribute("download") == "jagg-report-1-2.html"]
            return [a for a in named if a.is_displayed()] or None

        shown = wait.until(link)
        href = shown[0].get_attribute("href")
        assert href.startswith(app.url) and href.endswith(".html"), href
        import urllib.request

        with urllib.request.urlopen(href, timeout=10) as resp:  # the link serves the report itself
            page = resp.read().decode()
        assert "<html" in page.lower() and "Owner login" in page
        assert "<img src=//127.0.0.1" not in page  # the name is escaped in the report too
    finally:
        driver.quit()
