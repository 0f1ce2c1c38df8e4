"""Try it and Export model in headless Chromium: `python launch.py` over a runs folder holding one real
tiny-shapes run with a checkpoint (one training step), beside the shipped showcase (whose JAGG run ships its
model: the picker lists it after the user's run, and opens on it, the finished run trained longest).

Try it: a typed prompt and seed through the base model and the run's weights, side by side, each image
captioned with its reward, the worker's phases shown meanwhile; Cancel stops a second try. Export model: the
download link appears and the zip it serves holds the export's model card."""

from __future__ import annotations

import io
import re
import urllib.request
import zipfile
from pathlib import Path

import pytest
from browser import chromium

from jagg_engine.store import open_store
from jagg_engine.train.config import load_config
from jagg_engine.train.trainer import Trainer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
SMALL = [
    "steps=1", "prompts_per_step=2", "group_size=4", "sampling_steps=6", "sde_window_end=4",
    "eval_num_prompts=2", "eval_seeds=[0]", "eval_every=1", "sample_every=0", "checkpoint_every=1", "lr=1e-3",
]  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from test_app_e2e import LiveApp

    tmp = tmp_path_factory.mktemp("tryit")
    root = tmp / "runs"
    cfg = load_config(None, [*SMALL, "name=tried"])
    with open_store(root) as store:
        run_id = store.create_run(cfg.name, cfg.to_dict(), root / "run-0001")
    assert Trainer(cfg, run_id, str(root)).run() == "finished"
    live = LiveApp(root, tmp)
    live.start()
    live.run_id = run_id
    yield live
    live.stop()


def _text(driver, elem_id: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, elem_id)
    return found[0].text if found else ""


def _captions(driver, elem_id: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#' + arguments[0] + ' .caption-label')].map(c => c.textContent)",
        elem_id,
    )


def test_browser_try_it_base_and_run_side_by_side_then_cancel_then_export_model(app):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2)
        driver.get(app.url)
        tab = "//button[@role='tab' and normalize-space()='Try it']"
        wait.until(lambda d: d.find_elements(By.XPATH, tab))
        driver.find_element(By.XPATH, tab).click()
        box = driver.find_element(By.CSS_SELECTOR, "#tryit-run input")
        step_box = driver.find_element(By.CSS_SELECTOR, "#tryit-step input")
        # It opens on the finished run trained the most steps: the showcase's shipped 40-step model, not the
        # user's newer one-step run.
        picked = box.get_attribute("value")
        assert picked.startswith("#") and " showcase-jagg (" in picked, picked
        assert step_box.get_attribute("value") == "40"
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(app.run_id))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tryit-run ul.option-list li[data-index]"))
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: step_box.get_attribute("value") == "1")
        # the box shows the picked run's label once the page has drawn the server's answer, which on a busy
        # machine can come after the step box's: poll for it (the wait only bounds a hang)
        label = f"#{app.run_id} tried (jagg, "
        assert wait.until(lambda d: box.get_attribute("value").startswith(label) or None), box.get_attribute(
            "value"
        )
        prompts = driver.find_element(By.CSS_SELECTOR, "#tryit-prompts textarea")
        prompts.send_keys("red circle left")
        seeds = driver.find_element(By.CSS_SELECTOR, "#tryit-seeds textarea, #tryit-seeds input")
        seeds.send_keys(Keys.CONTROL, "a")
        seeds.send_keys("3")
        driver.find_element(By.ID, "tryit-generate").click()

        seen: list[str] = []

        def done(d) -> bool:
            seen.append(_text(d, "tryit-msg"))
            return seen[-1].startswith(("Same prompts", "Error", "Not started"))

        WebDriverWait(driver, 240, poll_frequency=0.2).until(done)
        message = seen[-1]
        assert message.startswith("Same prompts and noise: base (mean reward ") and (
            f"run #{app.run_id} at step 1" in message
        ), message
        assert any(m.startswith("Working (") for m in seen), set(seen)  # the worker's phases were shown
        wait.until(lambda d: _captions(d, "tryit-base") and _captions(d, "tryit-trained"))
        base, trained = _captions(driver, "tryit-base"), _captions(driver, "tryit-trained")
        assert len(base) == len(trained) == 1, (base, trained)
        for caption in (base[0], trained[0]):  # the same prompt and seed, each with its own reward
            prompt, seed, reward = caption.split(" · ")
            assert (prompt, seed) == ("red circle left", "seed 3") and re.fullmatch(
                r"reward -?\d\.\d{3}", reward
            )
        left = driver.find_element(By.CSS_SELECTOR, "#tryit-base img")
        right = driver.find_element(By.CSS_SELECTOR, "#tryit-trained img")
        assert left.location["x"] < right.location["x"] and abs(left.location["y"] - right.location["y"]) < 40
        assert left.get_attribute("src") != right.get_attribute("src")
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "app-try-it.png"))

        # A second try, cancelled while its worker runs.
        driver.find_element(By.ID, "tryit-generate").click()
        wait.until(lambda d: _text(d, "tryit-msg").startswith(("Working (", "Starting")))
        driver.find_element(By.ID, "tryit-cancel").click()
        wait.until(lambda d: _text(d, "tryit-msg").startswith("Cancelled"))

        # History: Export model of the run, offered as a zip once written.
        driver.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='History']").click()
        assert not [e for e in driver.find_elements(By.ID, "history-model-file") if e.is_displayed()]
        target = driver.find_element(By.CSS_SELECTOR, "#history-target input")
        target.send_keys(str(app.run_id))
        driver.find_element(By.ID, "history-export-model").click()
        name = f"jagg-model-run{app.run_id}-step1.zip"

        def link(d):
            found = d.find_elements(By.CSS_SELECTOR, "#history-model-file a[href]")
            return [a for a in found if a.get_attribute("download") == name and a.is_displayed()] or None

        shown = WebDriverWait(driver, 240, poll_frequency=0.3).until(link)
        href = shown[0].get_attribute("href")
        assert href.startswith(app.url) and href.endswith(".zip"), href
        with urllib.request.urlopen(href, timeout=30) as resp:
            archive = zipfile.ZipFile(io.BytesIO(resp.read()))
        card = archive.read(f"jagg-model-run{app.run_id}-step1/README.md").decode()
        assert card.startswith("---\nbase_model: tiny-shapes\nlibrary_name: diffusers\n")
        assert f"jagg-model-run{app.run_id}-step1/jagg_run.json" in archive.namelist()
        driver.save_screenshot(str(ARTIFACTS / "app-export-model.png"))
    finally:
        driver.quit()
