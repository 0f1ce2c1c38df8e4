"""`jagg eval` (jagg_engine.evaluate.run): outputs, determinism and one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from jagg_engine import evaluate  # noqa: E402


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    return parser.parse_args(["--out", str(tmp_path / "out"), "--device", "cpu", *extra])


def test_eval_prompts_are_64_fixed_captions() -> None:
    prompts = evaluate.eval_prompts()
    assert len(prompts) == 64 == len(set(prompts)) and prompts == evaluate.eval_prompts()


def test_run_writes_grid_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\nred circle left\n\nblue triangle top\n")
    extra = [
        "--prompts",
        str(prompts),
        "--seeds",
        "2",
        "--steps",
        "2",
        "--backbone-opt",
        "random_weights=true",
    ]
    assert evaluate.run(_args(tmp_path, *extra)) == 0
    out = capsys.readouterr().out
    assert "shapes:" in out and "colour" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_prompts"] == 2 and summary["seeds"] == 2
    assert set(summary["components"]) == {"colour", "position", "shape"}
    assert 0.0 <= summary["mean"] <= 1.0
    from PIL import Image

    grid = Image.open(tmp_path / "out" / "grid.png")
    assert grid.size[0] > 4 * 32 * 2  # 4 samples in a row, upscaled ×4
    first = (tmp_path / "out" / "grid.png").read_bytes()
    assert evaluate.run(_args(tmp_path, *extra)) == 0
    assert (tmp_path / "out" / "grid.png").read_bytes() == first  # deterministic sampling


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--backbone", "nope"], "unknown backbone 'nope'"),
        (["--reward", "nope"], "unknown reward 'nope'"),
        (["--prompts", "/no/such/file.txt"], "prompts file not found"),
        (["--seeds", "0"], "--seeds must be > 0"),
        (["--backbone-opt", "weights_dir=/no/such/dir"], "missing weight files"),
        (
            ["--schedule", "pipeline", "--backbone-opt", "random_weights=true"],
            "--schedule: backbone 'tiny-shapes' has no diffusers pipeline scheduler",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert evaluate.run(_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jagg eval: error: ") and message in err and "\n" not in err


def test_unknown_word_in_prompts_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("red dog left\n")
    extra = ["--prompts", str(prompts), "--steps", "1", "--backbone-opt", "random_weights=true"]
    assert evaluate.run(_args(tmp_path, *extra)) == 2
    assert "unknown" in capsys.readouterr().err
