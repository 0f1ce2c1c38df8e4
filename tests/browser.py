"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver, never a downloaded browser."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def chromium(window_size: str, logs: bool = False):
    """A headless Chromium WebDriver at ``window_size`` ("W,H"); with ``logs`` it keeps the performance
    (network) and browser (console) logs. Skips the test where Chromium or selenium is missing."""
    if not Path("/usr/bin/chromium").exists() or not Path("/usr/bin/chromedriver").exists():
        pytest.skip("needs Chromium: apt-get install -y chromium chromium-driver (and pip install selenium)")
    pytest.importorskip("selenium", reason="pip install selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--window-size={window_size}",
        "--disable-dev-shm-usage",
    ):  # fmt: skip
        options.add_argument(flag)
    if logs:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def until(driver, predicate: Callable, what: str, timeout: float = 120.0, state: str = "", app=None):
    """``predicate(driver)`` polled every 0.1 s until truthy (its value returned). A timeout fails with what was
    awaited, the page's URL, ``state`` (a JS snippet's return: what the page showed), the browser console's last
    lines and ``app``'s log tail, and leaves a screenshot in test-artifacts/: a wait that a busy machine
    outlasts says what the page was doing instead of selenium's empty TimeoutException."""
    import json
    import re

    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(predicate)
    except TimeoutException:
        lines = [f"waited {timeout:g} s for {what}", f"url: {driver.current_url}"]
        try:
            if state:
                lines.append("page: " + json.dumps(driver.execute_script(state))[-2000:])
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / ("timeout-" + re.sub(r"[^A-Za-z0-9]+", "-", what)[:60] + ".png")
            driver.save_screenshot(str(shot))
            lines.append(f"screenshot: {shot}")
            console = driver.get_log("browser")[-10:]
            lines += ["console: " + str(e.get("message", ""))[:300] for e in console]
        except WebDriverException as exc:
            lines.append(f"(the page could not be read: {str(exc).splitlines()[0][:200]})")
        if app is not None:
            lines.append("app log: " + app.read_log()[-2000:])
        raise AssertionError("\n".join(lines)) from None


def live_ready(run_id: int) -> str:
    """A JS expression: the Live tab selected, with run ``run_id``'s progress line shown (a Live link opened)."""
    return (
        "!!document.querySelector('#live-progress') && "
        f"document.querySelector('#live-progress').innerText.includes('Run #{run_id} ') && "
        "getComputedStyle(document.querySelector('#live-progress')).visibility !== 'hidden' && "
        "!!document.querySelector('button[role=tab][aria-selected=true]') && "
        "document.querySelector('button[role=tab][aria-selected=true]').innerText.trim() === 'Live'"
    )


def alert_open(driver):
    """The browser's own dialog when one is open (Cancel run's question), else False."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
        alert.text  # noqa: B018 (raises while none is open)
        return alert
    except NoAlertPresentException:
        return False


@contextmanager
def live_app(tmp_path_factory, name: str, fill: Callable[[Path], object]) -> Iterator:
    """The app (`launch.py`, a child process) over a runs folder that ``fill`` wrote first, stopped on exit:
    the browser test files' module fixture."""
    from test_app_e2e import LiveApp

    tmp = tmp_path_factory.mktemp(name)
    fill(tmp / "runs")
    live = LiveApp(tmp / "runs", tmp)
    live.start()
    try:
        yield live
    finally:
        live.stop()
