"""Links opened one after another in one Chromium tab: a page left does not keep its event streams.

Chromium keeps a page it may restore with Back (the back/forward cache) together with its open requests. A
gradio page holds its heartbeat stream open for as long as it lives, so every page left in the last minute
held a socket, and a browser opens at most six to one host: a run of Live links left the next page at
"Loading..." for 10-50 s (measured with scripts/bench_ui.py; docs/app.md). The page now ends its event
streams when it is hidden and reloads when it is restored (app.layout.STREAMS), so a page that comes back
with Back is a new page with streams of its own, not the cached one whose streams were held open.
"""

from __future__ import annotations

import pytest
from browser import chromium, live_app, live_ready, until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with live_app(tmp_path_factory, "links", lambda runs: None) as live:  # the showcase's runs #1 and #2
        yield live


def test_a_page_left_and_restored_with_back_is_a_new_page(app):
    driver = chromium("1400,1200")
    try:

        def shows(run: int):
            return lambda d: d.execute_script("return " + live_ready(run))

        driver.get(app.url + "?tab=live&run=1")
        until(driver, shows(1), "the Live tab of run #1", app=app)
        driver.execute_script("window.jaggLeft = true")  # lives only as long as this page
        driver.get(app.url + "?tab=live&run=2")
        until(driver, shows(2), "the Live tab of run #2", app=app)
        driver.back()
        until(driver, shows(1), "run #1's Live tab after Back", app=app)
        kept, how = driver.execute_script(
            "return [window.jaggLeft === true, performance.getEntriesByType('navigation')[0].type]"
        )
        assert not kept and how == "reload", (
            f"Back restored the cached page ({how}), which held its streams open while left"
        )
    finally:
        driver.quit()
