"""Live's SDE-window panel in real Chromium: its title, axis titles, tick labels and legend never overlap and
stay inside the figure, at a narrow, a half-page and a wide panel (the legend used to sit on the x axis title
and the y axis title ran into the figure's title)."""

from __future__ import annotations

import itertools
import time

import pandas as pd
import plotly.io as pio
import pytest
from browser import chromium

from app import metrics

PARTS = (".gtitle", ".xtitle", ".ytitle", ".y2title", ".legend", ".xaxislayer-above", ".yaxislayer-above")
BOXES = """
const out = {};
for (const sel of arguments[0]) {
  const el = document.querySelector(sel);
  if (el) { const r = el.getBoundingClientRect(); out[sel] = [r.left, r.top, r.right, r.bottom]; }
}
const fig = document.querySelector('.main-svg').getBoundingClientRect();
out.figure = [fig.left, fig.top, fig.right, fig.bottom];
return out;
"""


def window_frame(steps: int = 20) -> pd.DataFrame:
    """A sliding window of 4 over 10 sampling steps, with the σ at its start and after its end logged."""
    s = pd.Series(range(1, steps + 1))
    return pd.DataFrame(
        {
            "step": s,
            "sampler/window_start": s % 5,
            "sampler/window_end": s % 5 + 4,
            "sampler/sigma_window_start": 1 - (s % 5) / 10,
            "sampler/sigma_window_end": 0.5 - (s % 5) / 10,
        }
    )


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.slow
@pytest.mark.parametrize("width", [420, 560, 800])
def test_the_window_panels_labels_do_not_overlap(tmp_path, width):
    fig = metrics.window_figure(window_frame(), sampling_steps=10)
    fig.update_layout(width=width)
    page = tmp_path / "window.html"
    page.write_text(pio.to_html(fig, include_plotlyjs=True, full_html=True))  # plotly.js inline: no network
    driver = chromium(f"{width + 40},700")
    try:
        driver.get(page.as_uri())
        boxes = {}
        for _ in range(50):  # plotly draws after load
            boxes = driver.execute_script(BOXES, list(PARTS))
            if set(PARTS) <= set(boxes):
                break
            time.sleep(0.1)
    finally:
        driver.quit()
    assert set(PARTS) <= set(boxes), sorted(boxes)
    figure = boxes.pop("figure")
    for name, box in boxes.items():
        assert figure[0] <= box[0] and box[2] <= figure[2] + 1, (name, box, figure)
        assert figure[1] <= box[1] and box[3] <= figure[3] + 1, (name, box, figure)
    clashes = [
        (a, b)
        for a, b in itertools.combinations(boxes, 2)
        if {a, b} != {".xaxislayer-above", ".yaxislayer-above"} and overlap(boxes[a], boxes[b])
    ]
    assert not clashes, {name: [round(v) for v in box] for name, box in boxes.items()}
