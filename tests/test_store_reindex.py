"""`jagg reindex` (jagg_engine/store/reindex.py) when two run folders claim one identity: a run.json that
carries another run's uid (pasted into it), and a whole run folder copied beside its original. Both runs
stay indexed, each under its own uid; the one that was not genuine is named in one line."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from toy import TOY, jagg

from jagg_engine import cli
from jagg_engine.store import DB_NAME, HISTORY_FILE, RUN_FILE, read_history


def train_toy(root: Path, steps: int) -> None:
    assert cli.main(["train", *TOY, f"steps={steps}", "--runs-dir", str(root)]) == 0


def rows(root: Path) -> dict[str, list[tuple]]:
    """The runs (id, uid, status, last_step) and metrics rows of the index."""
    conn = sqlite3.connect(root / DB_NAME)
    try:
        return {
            "runs": conn.execute("SELECT id, uid, status, last_step FROM runs ORDER BY id").fetchall(),
            "metrics": conn.execute("SELECT * FROM metrics ORDER BY run_id, step, key").fetchall(),
        }
    finally:
        conn.close()


def run_doc(folder: Path) -> dict:
    return json.loads((folder / RUN_FILE).read_text())


def warnings(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("WARNING", "skipped"))]


def test_a_pasted_uid_keeps_the_genuine_run_and_gives_the_other_its_own_uid_back(tmp_path):
    """Run 2's uid is pasted into run 1's run.json (a text edit of the real file). Reindex keeps both runs
    with every metric row: run 2 keeps its uid (its history carries it), run 1 takes back the uid its own
    history and checkpoints carry (so they stay its own); one line says so. The next reindex is quiet."""
    root = tmp_path / "runs"
    train_toy(root, steps=3)
    train_toy(root, steps=2)
    before = rows(root)
    uid1, uid2 = (run_doc(root / f"run-000{n}")["uid"] for n in (1, 2))
    text = (root / "run-0001" / RUN_FILE).read_text()
    (root / "run-0001" / RUN_FILE).write_text(text.replace(uid1, uid2))

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0, done.stderr
    assert warnings(done.stdout) == [
        f"WARNING: run-0001: its run.json carried the uid {uid2[:12]} of run 2 (run-0002); indexed under its"
        f" history's own uid {uid1[:12]}; its run.json rewritten"
    ], done.stdout
    assert "reindexed 2 run(s)" in done.stdout
    assert rows(root) == before
    assert run_doc(root / "run-0001")["uid"] == uid1

    again = jagg("reindex", "--runs-dir", str(root))
    assert again.returncode == 0 and warnings(again.stdout) == [], again.stdout
    assert rows(root) == before
    manifests = sorted((root / "run-0001").glob("checkpoints/*/manifest.json"))
    assert manifests and {json.loads(m.read_text())["run_uid"] for m in manifests} == {uid1}


def test_a_copied_run_folder_is_indexed_beside_its_original_under_a_new_uid(tmp_path):
    """run-0001 copied whole to run-0002 (run.json, history and checkpoints carry run 1's uid and id). Both
    are indexed: run 1 as it was, the copy as run 2 under a new uid, its history's lines rewritten to that uid
    (each with a checksum that holds), with run 1's metrics; one line says so, and the next reindex agrees."""
    root = tmp_path / "runs"
    train_toy(root, steps=2)
    before = rows(root)
    uid1 = run_doc(root / "run-0001")["uid"]
    shutil.copytree(root / "run-0001", root / "run-0002")

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0, done.stderr
    after = rows(root)
    (one, uid_one, *rest_one), (two, uid_two, *rest_two) = after["runs"]
    assert (one, uid_one, rest_one) == (1, uid1, list(before["runs"][0][2:]))
    assert two == 2 and uid_two not in (uid1, None) and rest_two == rest_one
    assert warnings(done.stdout) == [
        f"WARNING: run-0002: its run.json carried the uid {uid1[:12]} of run 1 (run-0001); indexed under a new"
        f" uid (its history's lines rewritten to it) {uid_two[:12]}; its id 1 is another run's; indexed as"
        " run 2; its run.json rewritten"
    ], done.stdout
    copied = [m[1:] for m in after["metrics"] if m[0] == 2]
    assert copied == [m[1:] for m in after["metrics"] if m[0] == 1] and copied
    history = read_history(root / "run-0002" / HISTORY_FILE, uid_two)
    assert history.skipped == [] and history.records
    assert (run_doc(root / "run-0002")["id"], run_doc(root / "run-0002")["uid"]) == (2, uid_two)

    again = jagg("reindex", "--runs-dir", str(root))
    assert again.returncode == 0 and warnings(again.stdout) == [], again.stdout
    assert rows(root) == after
