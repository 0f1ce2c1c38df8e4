"""`jagg study`: the cosine table on the Theorem-1 toy, the parity summary on a hand-made history."""

import json

import pandas as pd
import pytest

from jagg_engine.cli import main
from jagg_engine.study import run_summary


def test_cosine_study_linear_toy_is_exact(tmp_path, capsys):
    code = main(
        [
            "study",
            "cosine",
            "--backbone",
            "linear-toy",
            "--window",
            "4",
            "--steps",
            "8",
            "--sde-window",
            "0:8",
            "--batches",
            "2",
            "--batch",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "cosine-linear-toy.json").read_text())
    assert [g["index"] for g in result["groups"]] == [0, 1]
    for g in result["groups"]:
        assert g["cosine_mean"] == pytest.approx(1.0, abs=1e-9) and g["cosine_std"] < 1e-9
        assert g["endpoint_cosine_mean"] < 0.999  # the ablation is not exact
    assert "| 0 | 1.00 → 0.62 |" in capsys.readouterr().out


def test_cosine_study_bad_input(capsys):
    assert main(["study", "cosine", "--backbone", "linear-toy", "--batches", "0"]) == 2
    assert capsys.readouterr().err.strip() == "jagg study: error: batches: must be a positive integer, got 0"


def test_run_summary_by_hand():
    steps = list(range(0, 21))
    frame = pd.DataFrame(
        {
            "step": steps,
            "reward/mean": [None] + [0.5] * 10 + [0.6] * 10,  # first 10 steps 0.5, last 10 steps 0.6
            "eval/reward/mean": [0.40] + [None] * 9 + [0.45] + [None] * 9 + [0.47],
            "time/update": [None, 9.0] + [2.0] * 19,  # step 1 (warm-up) is left out of the median
            "time/step": [None] + [3.0] * 20,
        }
    )
    s = run_summary(frame)
    assert s["steps"] == 20
    assert s["train_gain"] == pytest.approx(0.1)
    assert s["eval_gain"] == pytest.approx(0.07) and s["eval_end"] == pytest.approx(0.47)
    assert s["update_s_median"] == 2.0


def test_parity_png_falls_back_to_a_headless_browser(tmp_path) -> None:
    import shutil

    import plotly.graph_objects as go

    from jagg_engine.study import BROWSERS, _browser_png

    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[1.0, 1.1, 1.2]))
    ok = _browser_png(fig, tmp_path / "f.png", 400, 300)
    has_browser = any(shutil.which(b) for b in BROWSERS)
    assert ok == has_browser
    if ok:
        assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
