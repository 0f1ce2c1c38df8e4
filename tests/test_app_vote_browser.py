"""The Vote tab in headless Chromium: a person votes with the keyboard (2 picks the second image, s skips) on
a picks run's pending groups, and each vote is in the store when the page says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser import chromium
from PIL import Image
from polling import wait_for

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


# A whole tiny-shapes run trained on a scripted person's clicks in the page. The person's hidden taste is
# "small" (prefers one small shape): training grows the shapes whatever the reward, so drift cannot fake the
# rise. Measured with the same settings through the store's API (seed 0): small rises 0.903 → 0.959 (+0.056);
# a person voting at random moves it the other way (0.903 → 0.865), so the margin below fails without the votes.
PICKS_RUN = [
    "configs/tiny-shapes-cpu.yaml", "steps=6", "prompts_per_step=2", "group_size=4", "eval_num_prompts=8",
    "eval_seeds=[0]", "eval_every=6", "sample_every=0", "checkpoint_every=0", "seed=0", "rewards={picks: 1.0}",
    "reward_options={picks: {picks_per_step: 1, timeout_s: 600, poll_s: 0.05}}",
]  # fmt: skip
MARGIN = 0.03


def _shown_group(driver) -> tuple[int, int] | None:
    """(step, group) of the group the page asks about, once its images are drawn; else None."""
    import re

    from selenium.webdriver.common.by import By

    found = re.search(r"waiting for your picks — step (\d+), group (\d+)", _text(driver, "vote-status"))
    images = driver.find_elements(By.CSS_SELECTOR, "#vote-images img")
    if not found or len(images) != 4 or not all(i.get_attribute("src") for i in images):
        return None
    return int(found.group(1)), int(found.group(2))


def test_a_person_trains_a_run_by_voting_in_the_page_and_their_taste_rises(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import urllib.request
    from io import BytesIO

    import numpy as np
    import torch
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_app_e2e import REPO, LiveApp

    from jagg_engine.picks import load_images, taste_small

    root = tmp_path / "runs"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "jagg_engine.cli", "train", *PICKS_RUN, "--runs-dir", str(root)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    live, driver = LiveApp(root, tmp_path), None
    try:
        assert wait_for(lambda: _running_run(root) or trainer.poll() is not None), "the run never started"
        assert trainer.poll() is None, trainer.stderr.read()[-3000:]
        live.start()
        driver = chromium("1400,1000")
        driver.get(live.url)
        wait = WebDriverWait(driver, 300)  # bounds a hang; each step waits for the vote, not for a clock
        wait.until(lambda d: d.find_elements(By.XPATH, "//button[@role='tab' and normalize-space()='Vote']"))
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Vote']").click()
        voted: list[tuple[int, int]] = []
        while len(voted) < 6:
            shown = wait.until(lambda d: (g := _shown_group(d)) and g not in voted and g)
            srcs = [i.get_attribute("src") for i in driver.find_elements(By.CSS_SELECTOR, "#vote-images img")]
            pixels = [
                np.asarray(Image.open(BytesIO(urllib.request.urlopen(s).read())).convert("RGB")) for s in srcs
            ]
            best = int(taste_small(torch.from_numpy(np.stack(pixels))).argmax())  # what the person sees
            ActionChains(driver).send_keys(str(best + 1)).perform()
            said = f"image {best + 1} is the best of group {shown[1]}, step {shown[0]}"
            wait.until(lambda d, said=said: said in _text(d, "vote-msg"))
            voted.append(shown)
        assert trainer.wait(timeout=600) == 0, trainer.stderr.read()[-3000:]
        with open_store(root) as store:
            (run,) = [r for r in store.list_runs() if "picks" in r["config"]["rewards"]]  # the showcase aside
            assert run["status"] == "finished"
            assert [(v["step"], v["choice"], v["voter"]) for v in store.votes(run["id"])] == [
                (s, "best", "owner") for s in range(1, 7)
            ]
            by_step: dict[int, list[str]] = {}
            for sample in store.samples(run["id"], kind="eval"):
                by_step.setdefault(sample["step"], []).append(sample["path"])
        start, end = (
            float(taste_small(load_images(run["run_dir"], sorted(by_step[s]))).mean()) for s in (0, 6)
        )
        assert end >= start + MARGIN, f"small: {start:.4f} -> {end:.4f}"
    finally:
        if driver is not None:
            driver.quit()
        live.stop()
        if trainer.poll() is None:
            trainer.kill()


def _running_run(root: Path) -> bool:
    import sqlite3

    if not (root / "jagg.db").exists():
        return False
    try:  # the trainer may be creating the index this very moment
        with open_store(root) as store:
            return any(r["status"] == "running" for r in store.list_runs())
    except sqlite3.OperationalError:
        return False
