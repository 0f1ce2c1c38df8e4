"""What a race keeps for its report (jagg_engine/race/report.py): every report `jagg race` writes from its
runs saves each run's run.json and history.jsonl (gzipped) under DIR/history/, and `--report-only` rebuilds
the same race.json, race.svg and race.md from them where DIR/runs/ is gone: from a tiny race run here, and
from every race committed under reports/race/ with its history."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from toy import RACE_TINY

from jagg_engine.store import HISTORY_FILE, RUN_FILE

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = ("race.json", "race.svg", "race.md")
TINY = RACE_TINY  # as tests/test_race.py (tests/toy.py)


def jagg_race(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jagg_engine.cli", "race", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


def committed_races_with_history() -> list[Path]:
    return sorted(p.parent for p in (REPO / "reports" / "race").glob("*/history"))


def outputs(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in OUTPUTS}


@pytest.mark.slow
def test_a_race_saves_its_runs_history_and_its_report_comes_back_from_it_alone(tmp_path):
    out = tmp_path / "race"
    done = jagg_race(
        "--variant", "exact:strategy=exact", "--variant", "jagg:strategy=jagg", "--seeds", "0",
        "--out", str(out), "--threads", "1", "steps=2", *TINY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    race = json.loads((out / "race.json").read_text())
    folders = sorted(p.name for p in (out / "history").iterdir())
    assert folders == [f"run-{r['run_id']:04d}" for r in race["runs"]] == ["run-0001", "run-0002"]
    for name in folders:
        kept = out / "history" / name
        assert sorted(p.name for p in kept.iterdir()) == [
            f"{HISTORY_FILE}.gz",
            RUN_FILE,
        ]  # no checkpoint, log
        original = out / "runs" / name
        assert (
            gzip.decompress((kept / f"{HISTORY_FILE}.gz").read_bytes())
            == (original / HISTORY_FILE).read_bytes()
        )
        assert (kept / RUN_FILE).read_bytes() == (original / RUN_FILE).read_bytes()
    before = outputs(out)
    shutil.rmtree(out / "runs")  # what a repository holds of a race

    again = jagg_race("--report-only", "--out", str(out))

    assert again.returncode == 0, again.stderr[-3000:]
    assert outputs(out) == before
    assert not (out / "runs").exists()
    vs = jagg_race("--report-only", "--out", str(out), "--baseline", "jagg")  # another baseline, from it too
    assert vs.returncode == 0, vs.stderr[-3000:]
    assert json.loads((out / "race-vs-jagg.json").read_text())["summary"]["baseline"] == "jagg"


def test_a_committed_race_is_rebuilt_from_the_repository_figure_for_figure(tmp_path, monkeypatch, capsys):
    """What git holds of each race with a history/ (never runs/): its plan, with every figure the report
    computes emptied, and history/. --report-only writes race.json, race.svg and race.md back, byte
    for byte as committed. The command runs in this process (jagg_engine.cli.main, as the `jagg` script
    calls it), not in a fresh interpreter per race, whose imports took as long as the reports."""
    from jagg_engine.cli import main

    monkeypatch.chdir(REPO)
    races = committed_races_with_history()
    assert races, "no race under reports/race/ keeps its history/"
    for folder in races:
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("runs", ".race.lock"))
        plan = json.loads((copy / "race.json").read_text())
        plan["summary"] = plan["heats"] = None  # emptied in place: the report fills them again, keys in order
        for entry in plan[
            "runs"
        ]:  # threads_logged stays: train.log gives it, and history/ leaves the log out
            entry["status"] = entry["trained_from_unix"] = entry["trained_to_unix"] = None
        (copy / "race.json").write_text(json.dumps(plan, indent=1))
        (copy / "race.svg").unlink()
        (copy / "race.md").unlink()

        code = main(["race", "--report-only", "--out", str(copy)])

        assert code == 0, (folder.name, capsys.readouterr().err[-3000:])
        assert outputs(copy) == outputs(folder), folder.name
        assert not (copy / "runs").exists()


def test_a_race_without_runs_or_history_is_refused_in_one_line(tmp_path):
    folder = REPO / "reports" / "race" / "early-window-shipped"  # committed before races kept history/
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("runs", ".race.lock"))
    done = jagg_race("--report-only", "--out", str(copy))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"jagg race: error: --out: {copy} holds no race (race.json and runs/jagg.db or history/)"
    ]
    assert outputs(copy) == outputs(folder)
