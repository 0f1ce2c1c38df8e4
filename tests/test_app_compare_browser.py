"""Compare in headless Chromium (`python launch.py` over a runs folder the test writes), where what the page
computes itself must agree with the server: the default reward level (a level no run has at its first eval,
or a line saying there is none), and a log scale ticked on a metric with no positive value (a note in its
plot, not an empty panel).

Runs #3–#5: 4 steps each, an eval every 2 steps (#3 exact ends below where it started, #4 jagg improves, #5
jagg ends below its start too), loss/clipfrac 0 at every step (nothing clipped). The shipped showcase is runs #1–#2.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from browser import chromium, live_app
from test_app_views_browser import PLOT, _reach_rows, _server_reach, _set_text, timed, timed_text

from app import showcase
from jagg_engine.store import open_store
from jagg_engine.train.config import TrainConfig

pytestmark = pytest.mark.slow

RUNS = {3: ("worse", "exact", (0.3, 0.28, 0.25)), 4: ("better", "jagg", (0.3, 0.5, 0.6)),
        5: ("flat", "jagg", (0.3, 0.32, 0.29))}  # fmt: skip


def _fill(root: Path) -> None:
    with open_store(root) as store:
        assert showcase.install(store, root) == [1, 2]
        base = TrainConfig().apply_overrides(["eval_every=2"]).to_dict()
        for n, (name, strategy, evals) in RUNS.items():
            cfg = {**base, "steps": 4, "strategy": strategy, "output_dir": str(root.resolve())}
            run_id = store.create_run(name, cfg, None)
            assert run_id == n
            store.set_run_dir(run_id, root / f"run-{run_id:04d}")
            store.set_status(run_id, "running", pid=None)
            t0 = time.time() - 3600
            for step in range(5):
                row = {"time/unix": t0 + 5.0 * step}
                if step:
                    row |= {"reward/mean": 0.1 * step, "loss/clipfrac": 0.0, "grad/norm": 1.0 / step, "time/step": 4.0,
                            "time/train_elapsed": 4.0 * step}  # fmt: skip
                if step % 2 == 0:
                    row["eval/reward/mean"] = evals[step // 2]
                store.log_step(run_id, step, row)
            store.set_status(run_id, "finished")
            store.set_times(run_id, t0, t0, row["time/unix"])
            (root / f"run-{run_id:04d}").mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with live_app(tmp_path_factory, "compare", _fill) as live:
        yield live


def _drawn(driver, plot_id: str = "compare-plot", run: str = "#3 exact") -> bool:
    """The plot is drawn for the link's runs (not the showcase the page opens on) with the series the page
    recomputes it from."""
    plot = driver.execute_script(PLOT, plot_id) or {}
    return (plot.get("meta") or 0) > 0 and any(n.startswith(run + " · ") for n in plot.get("names") or [])


def _message(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "compare-msg").text


def test_the_default_reward_level_is_one_no_run_has_at_its_first_eval_in_the_page_as_on_the_server(app):
    """#3 ends at 0.25, below where both runs started (0.3): the default level is #4's final eval (0.6), not
    0.25 (which both "reach" at step 0, 0 s, 0 %), drawn by the server at load and by the page when the level
    box is emptied. #3 and #5 both end below 0.3: no level, and the line says so, in the page too."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    try:
        wait = WebDriverWait(driver, 120, poll_frequency=0.2)
        driver.get(app.url + "?tab=compare&runs=3,4")
        said = "Time to reach eval reward 0.6 (the lowest final eval above the runs' first evals, #4 jagg's)."
        wait.until(lambda d: said in _message(d))  # the server's, at load
        wait.until(_drawn)  # the page reads the eval traces' series
        server = _server_reach(app.runs_dir, [3, 4])
        assert _reach_rows(driver) == server(None) == ["#3", "exact", "not", "reached", "(best", 0.3, "at",
                                                       "step", 0, "/", 0.0, "s)", "not", "reached", "-", 0.25,
                                                       "#4", "jagg", 4, 16.0, 100, "%", 0.6]  # fmt: skip
        assert timed_text(driver, _set_text("compare-level", "0.5"), "(the level asked)") >= 0
        assert timed_text(driver, _set_text("compare-level", ""), said) >= 0  # the page's
        assert _reach_rows(driver) == server(None)

        driver.get(app.url + "?tab=compare&runs=3,5")
        none = (
            "No reward level by default: no final eval is above #3 exact's first eval (0.3), a level it has "
            "from its start; type a level."
        )
        wait.until(lambda d: none in _message(d))  # the server's
        wait.until(_drawn)
        assert _reach_rows(driver) == []
        assert timed_text(driver, _set_text("compare-level", "0.29"), "(the level asked)") >= 0
        assert timed_text(driver, _set_text("compare-level", ""), none) >= 0  # the page's
        assert _reach_rows(driver) == []
    finally:
        driver.quit()


NOTE = "loss/clipfrac: no positive values for a log axis; untick log scale"
# The log-scale notes of the plot (text and the axis they sit on) and the text plotly drew for them.
NOTES = """
const g = document.querySelector('#compare-metrics .js-plotly-plot');
return {notes: (g.layout.annotations || []).filter(a => a.name === 'jagg-log-note').map(a => [a.text, a.yref]),
        drawn: [...g.querySelectorAll('.annotation-text')].map(t => t.textContent)};
"""
LOG_CLICK = "document.querySelector('#compare-log-scale input').click();"


def test_log_scale_on_an_all_zero_metric_says_so_in_its_plot_and_unticking_draws_it_again(app):
    """loss/clipfrac (a default metric) is 0 at every step: log scale ticked in the page leaves its plot with a
    note saying it has no positive values for a log axis (grad/norm's plot none); unticked, the note goes and
    its zeros are drawn. A link with log=1 opens on the server's note, and unticking draws the zeros too."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium("1400,2400")
    try:
        wait = WebDriverWait(driver, 120, poll_frequency=0.2)
        driver.get(app.url + "?tab=compare&runs=3,4")
        wait.until(lambda d: _drawn(d, "compare-metrics"))
        assert driver.execute_script(NOTES)["notes"] == []
        logged = "g._fullLayout.yaxis.type === 'log' && (g.layout.annotations || []).some(a => a.name === 'jagg-log-note')"
        assert timed(driver, LOG_CLICK, "compare-metrics", logged) >= 0
        shown = driver.execute_script(NOTES)
        assert shown["notes"] == [[NOTE, "y domain"]]  # in loss/clipfrac's plot (the first), only there
        assert NOTE in shown["drawn"], shown["drawn"]
        plot = driver.execute_script(PLOT, "compare-metrics")
        assert all(ys == [] for n, ys in zip(plot["names"], plot["ys"]) if "loss/clipfrac" in n)
        assert any(ys for n, ys in zip(plot["names"], plot["ys"]) if "grad/norm" in n), plot
        linear = "g._fullLayout.yaxis.type === 'linear' && !(g.layout.annotations || []).some(a => a.name === 'jagg-log-note')"
        assert timed(driver, LOG_CLICK, "compare-metrics", linear) >= 0
        plot = driver.execute_script(PLOT, "compare-metrics")
        zeros = [ys for n, ys in zip(plot["names"], plot["ys"]) if n == "#3 exact · loss/clipfrac"]
        assert zeros == [[0.0, 0.0, 0.0, 0.0]], zeros
        assert NOTE not in driver.execute_script(NOTES)["drawn"]

        driver.get(app.url + "?tab=compare&runs=3,4&log=1")
        wait.until(lambda d: _drawn(d, "compare-metrics") and d.execute_script(NOTES)["notes"])
        assert driver.execute_script(NOTES)["notes"] == [[NOTE, "y domain"]]  # the server's
        assert timed(driver, LOG_CLICK, "compare-metrics", linear) >= 0
        plot = driver.execute_script(PLOT, "compare-metrics")
        assert [ys for n, ys in zip(plot["names"], plot["ys"]) if n == "#4 jagg · loss/clipfrac"] == [
            [0.0] * 4
        ]
    finally:
        driver.quit()
