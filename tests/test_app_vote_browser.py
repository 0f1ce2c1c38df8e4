"""The Vote tab in headless Chromium: a person votes with the keyboard (2 picks the second image, s skips) on
a picks run's pending groups, and each vote is in the store when the page says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser import chromium
from PIL import Image

from jagg_engine.store import open_store

pytestmark = pytest.mark.slow


def post_group(store, run_id: int, folder: Path, step: int, colours: list[tuple[int, int, int]]) -> None:
    paths = []
    for k, colour in enumerate(colours):
        rel = f"picks/step_{step:05d}/g00_{k}.png"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), colour).save(folder / rel)
        paths.append(rel)
    store.post_pick_groups(
        run_id, step, [{"group_index": 0, "prompt": f"red circle left {step}", "paths": paths}]
    )


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from test_app_e2e import LiveApp

    tmp = tmp_path_factory.mktemp("vote")
    root = tmp / "runs"
    with open_store(root) as store:
        run_id, folder = store.create_run_folder("picks", {"rewards": {"picks": 1.0}, "steps": 3})
        store.set_status(run_id, "running", pid=None)  # its row says it trains (no trainer: the test asks)
        post_group(store, run_id, folder, 1, [(200, 0, 0), (0, 200, 0), (0, 0, 200)])
    live = LiveApp(root, tmp)
    live.start()
    yield live, root, run_id, folder
    live.stop()


def _text(driver, elem_id: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, elem_id)
    return found[0].text if found else ""


def test_keys_vote_on_the_shown_group_and_the_store_has_each_vote(app) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    live, root, run_id, folder = app
    driver = chromium("1400,1000")
    try:
        driver.get(live.url)
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='Vote']"))
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Vote']").click()
        wait.until(lambda d: "waiting for your picks" in _text(d, "vote-status"))
        assert "red circle left 1" in _text(driver, "vote-status")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#vote-images img")) == 3)
        ActionChains(driver).send_keys("2").perform()
        wait.until(lambda d: "Voted: image 2 is the best" in _text(d, "vote-msg"))
        with open_store(root) as store:
            assert [(v["step"], v["sample"], v["choice"]) for v in store.votes(run_id)] == [(1, 1, "best")]
            post_group(store, run_id, folder, 2, [(10, 10, 10), (250, 250, 250)])
        # the tab's timer brings the next group; s skips it
        wait.until(lambda d: "red circle left 2" in _text(d, "vote-status"))
        time.sleep(0.5)
        ActionChains(driver).send_keys("s").perform()
        wait.until(lambda d: "Skipped group 0 of step 2" in _text(d, "vote-msg"))
        with open_store(root) as store:
            assert [(v["step"], v["sample"], v["choice"]) for v in store.votes(run_id)] == [
                (1, 1, "best"),
                (2, None, "skip"),
            ]
        assert "votes cast: **2**" not in _text(driver, "vote-counter")  # drawn as Markdown, not raw
        assert "votes cast: 2" in _text(driver, "vote-counter")
    finally:
        driver.quit()
