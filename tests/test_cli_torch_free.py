"""`jagg --help`, `jagg runs`, `jagg export`, `jagg reindex` and `jagg report` answer without importing torch.

Each command runs through ``jagg_engine.cli.main`` in a fresh interpreter over a runs folder holding one
recorded run (written here through the store, as the trainer writes one); after the command the child prints
which heavy modules are in ``sys.modules``, and torch (or diffusers, transformers, accelerate) must not be;
`--help`, `runs` and `reindex` import no pandas either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jagg_engine.store import open_store

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers", "accelerate")
# the commands that read no frame start without pandas too (the store imports sqlite_utils without it)
NO_PANDAS = ("--help", "runs", "reindex")

RUNNER = r"""
import contextlib, io, json, sys
from jagg_engine import cli

out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = cli.main(json.loads(sys.argv[1]))
    except SystemExit as exc:  # --help exits 0 from argparse
        code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print("RESULT " + json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()[-2000:]}), file=sys.__stdout__)
"""


def run_cli(argv: list[str], cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(argv), json.dumps([*HEAVY, "pandas"])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return {**json.loads(line.removeprefix("RESULT ")), "stderr": proc.stderr[-2000:]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("cli") / "runs"
    with open_store(runs) as store:
        run_id, _folder = store.create_run_folder("recorded", {"name": "recorded", "steps": 2})
        store.set_status(run_id, "running", pid=None)
        for step in range(2):
            store.log_step(run_id, step, {"reward/mean": 0.1 * step, "eval/reward_mean": 0.2 + step})
        store.set_status(run_id, "finished")
    return runs


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["runs", "--runs-dir", "{runs}"],
        ["export", "1", "--runs-dir", "{runs}", "--out", "{tmp}"],
        ["reindex", "--runs-dir", "{runs}"],
        ["report", "1", "--runs-dir", "{runs}", "--out", "{tmp}/report.html"],
        ["export", "--help"],
        ["reindex", "--help"],
    ],
    ids=lambda argv: " ".join(a for a in argv if not a.startswith("{")),
)
def test_command_imports_no_torch(argv: list[str], runs: Path, tmp_path: Path) -> None:
    argv = [a.format(runs=runs, tmp=tmp_path) for a in argv]
    result = run_cli(argv, tmp_path)
    assert result["code"] in (0, None), result
    heavy = [m for m in result["heavy"] if m != "pandas" or argv[0] in NO_PANDAS]
    assert heavy == [], f"jagg {' '.join(argv)} imported {heavy}"
    if argv[0] == "--help":
        assert "reindex" in result["out"] and "train" in result["out"]
    if argv[0] == "runs":
        assert "recorded" in result["out"]
    if argv[0] == "report":
        assert (tmp_path / "report.html").stat().st_size > 1000


def test_a_command_that_needs_torch_still_builds_its_arguments(tmp_path: Path) -> None:
    """The selective parser builds the named command's arguments: `jagg probe --help` lists its flags."""
    result = run_cli(["probe", "--help"], tmp_path)
    assert result["code"] == 0 and "--backbone" in result["out"] and "--window" in result["out"], result
