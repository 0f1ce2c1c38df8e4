"""`jagg probe` through the real entry point, in a subprocess, as a user runs it."""

import json
import math
import subprocess
import sys

import pytest


def jagg(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_probe_linear_toy_json_is_exact():
    proc = jagg("probe", "--backbone", "linear-toy", "--window", "4", "--steps", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["groups"]) == 3
    for g in out["groups"]:
        assert set(g) >= {"index", "t_start", "t_end", "cosine", "rel_error"}
        assert g["cosine"] >= 0.999999 and g["rel_error"] <= 1e-6
        assert g["t_start"] > g["t_end"]


def test_probe_tiny_flux_json_three_finite_groups():
    proc = jagg("probe", "--backbone", "tiny-flux", "--window", "4", "--steps", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(proc.stdout)["groups"]
    assert [g["index"] for g in groups] == [0, 1, 2]
    assert all(math.isfinite(g["cosine"]) and -1 <= g["cosine"] <= 1 for g in groups)
    # a real transformer is not linear: the probe must see it
    assert any(g["rel_error"] > 1e-3 for g in groups)


def test_probe_table():
    proc = jagg("probe", "--backbone", "linear-toy", "--window", "3", "--steps", "6", "--endpoint")
    assert proc.returncode == 0, proc.stderr
    assert "cosine" in proc.stdout and "endpoint_cos" in proc.stdout and "whole-update cosine" in proc.stdout


@pytest.mark.parametrize(
    "args, field",
    [
        (["--window", "1"], "window"),
        (["--backbone", "nope"], "backbone"),
        (["--steps", "0"], "steps"),
        (["--steps", "-3"], "steps"),
        (["--algorithm", "ddim"], "algorithm"),
    ],
)
def test_probe_bad_input_one_line_exit_2(args, field, capsys):
    from jagg_engine.cli import main

    try:
        code = main(["probe", "--backbone", "linear-toy", *args])
    except SystemExit as exc:  # argparse-level errors exit from inside the parser
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert field in lines[0] and lines[0].startswith("jagg probe: error:")
    assert out == ""


def test_probe_bad_input_through_the_entry_point_has_no_traceback():
    proc = jagg("probe", "--window", "1")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "jagg probe: error: window: must be an integer >= 2 for strategy jagg (a one-step window trains with strategy=exact), got 1"
    )
    assert proc.stdout == ""


def test_jagg_frac_outside_range_is_rejected_by_config():
    # `jagg probe` has no routing flag; the same validation guards every entry point through UpdateConfig
    from jagg_engine.jagg import UpdateConfig

    with pytest.raises(ValueError, match=r"^jagg_frac: must be in \[0, 1\], got -0.1"):
        UpdateConfig(jagg_frac=-0.1)
