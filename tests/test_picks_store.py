"""Votes in the run store: one per (run, step, group, voter), committed before use, every refusal in one line,
and a real kill -9 right after a vote loses no cast vote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jagg_engine.store import StoreError, open_store, reindex

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"rewards": {"picks": 1.0}, "reward_options": {"picks": {"voter": "ana"}}}


def running_run(root: Path, config: dict = CONFIG) -> tuple[object, int]:
    store = open_store(root)
    run_id, _ = store.create_run_folder("picks", config)
    store.claim(run_id, ("queued",), os.getpid())
    store.post_pick_groups(
        run_id,
        1,
        [
            {"group_index": g, "prompt": f"p{g}", "paths": [f"picks/{g}_{k}.png" for k in range(4)]}
            for g in range(3)
        ],
    )
    return store, run_id


def test_a_vote_is_stored_and_read_back(tmp_path: Path) -> None:
    store, run_id = running_run(tmp_path)
    vote = store.cast_vote(run_id, 1, 2, 3, "best", "ana")
    store.cast_vote(run_id, 1, 0, None, "skip", "ana")
    store.cast_vote(run_id, 1, 1, 0, "worst", "ana")
    rows = store.votes(run_id)
    assert [(r["group_index"], r["sample"], r["choice"], r["voter"]) for r in rows] == [
        (2, 3, "best", "ana"),
        (0, None, "skip", "ana"),
        (1, 0, "worst", "ana"),
    ]
    assert rows[0]["created_at"] == vote["created_at"]
    assert [g["status"] for g in store.pick_groups(run_id)] == ["pending"] * 3
    assert store.pick_groups(run_id, "pending")[0]["size"] == 4
    _, exported = store.export_run(run_id, tmp_path / "export")
    assert json.loads(exported.read_text())["votes"] == rows  # the run's record carries every vote


def refusal(store, *args) -> str:
    before = len(store.votes(args[0]))
    with pytest.raises(StoreError) as err:
        store.cast_vote(*args)
    assert len(store.votes(args[0])) == before  # nothing written
    message = str(err.value)
    assert "\n" not in message
    return message


def test_every_refusal_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    store, run_id = running_run(tmp_path)
    store.cast_vote(run_id, 1, 0, 1, "best", "ana")
    assert "already voted" in refusal(store, run_id, 1, 0, 2, "worst", "ana")
    assert "no such group" in refusal(store, run_id, 1, 7, 0, "best", "ana")
    assert "no such group" in refusal(store, run_id, 2, 0, 0, "best", "ana")
    assert "takes votes from 'ana' only, not from 'bob'" in refusal(store, run_id, 1, 1, 0, "best", "bob")
    assert "must be in 0..3" in refusal(store, run_id, 1, 1, 4, "best", "ana")
    assert "choice: must be one of best, worst, skip" in refusal(store, run_id, 1, 1, 0, "rank", "ana")
    assert "needs a sample index" in refusal(store, run_id, 1, 1, None, "best", "ana")
    assert "no run with id 99" in refusal(store, 99, 1, 1, 0, "best", "ana")
    store.close_pick_groups(run_id, 1)  # the step went on: a vote now is late, kept (not a refusal) ...
    assert store.cast_vote(run_id, 1, 1, 0, "best", "ana")["late"] is True
    assert "already voted" in refusal(store, run_id, 1, 1, 2, "worst", "ana")  # ... and still one a group
    store.post_pick_groups(run_id, 2, [{"group_index": 0, "prompt": "p", "paths": ["a.png", "b.png"]}])
    store.request_cancel(run_id)
    assert "was cancelled" in refusal(store, run_id, 2, 0, 0, "best", "ana")
    other = store.create_run_folder("plain", {"rewards": {"shapes": 1.0}})[0]
    store.claim(other, ("queued",), os.getpid())
    assert "does not train on picks" in refusal(store, other, 1, 0, 0, "best", "ana")
    queued = store.create_run_folder("queued", CONFIG)[0]
    assert "is queued; votes are taken only while it runs" in refusal(store, queued, 1, 0, 0, "best", "ana")


def test_a_replayed_step_keeps_its_votes_and_reindex_restores_them(tmp_path: Path) -> None:
    store, run_id = running_run(tmp_path)
    store.cast_vote(run_id, 1, 1, 2, "best", "ana")
    store.close_pick_groups(run_id)
    store.truncate_after(run_id, 0)  # a resume from step 0 replays step 1
    store.post_pick_groups(run_id, 1, [{"group_index": 1, "prompt": "p1", "paths": ["x.png"] * 4}])
    assert [(v["group_index"], v["sample"]) for v in store.votes(run_id)] == [(1, 2)]
    assert "already voted" in refusal(store, run_id, 1, 1, 0, "best", "ana")
    store.close()
    (tmp_path / "jagg.db").unlink()
    for extra in ("jagg.db-wal", "jagg.db-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    reindex(tmp_path)
    again = open_store(tmp_path)
    assert [(v["step"], v["group_index"], v["sample"], v["choice"]) for v in again.votes(run_id)] == [
        (1, 1, 2, "best")
    ]


VOTER = """
import sys
from jagg_engine.store import open_store
store = open_store(sys.argv[1])
run_id = int(sys.argv[2])
for g in range(int(sys.argv[3])):
    store.cast_vote(run_id, 1, g, g % 4, "best", "ana")
    print(g, flush=True)  # after the commit
sys.stdin.readline()  # hold on until killed
"""


def test_kill_9_right_after_votes_loses_no_cast_vote(tmp_path: Path) -> None:
    """A real process casts votes and is killed with SIGKILL while it is still voting, right after it reported
    its fifth: every vote it reported is in the index (read by a fresh store), and at most the one in flight
    besides; the index is intact."""
    store, run_id = running_run(tmp_path)
    store.post_pick_groups(
        run_id,
        1,
        [{"group_index": g, "prompt": "p", "paths": [f"{g}_{k}.png" for k in range(4)]} for g in range(200)],
    )
    store.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", VOTER, str(tmp_path), str(run_id), "200"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    reported = []
    while len(reported) < 5:
        line = proc.stdout.readline()
        assert line, "the voter ended before casting its votes"
        reported.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    fresh = open_store(tmp_path)  # runs PRAGMA quick_check: a torn index would raise here
    stored = [(v["group_index"], v["sample"]) for v in fresh.votes(run_id)]
    assert stored[: len(reported)] == [(g, g % 4) for g in reported]
    assert len(reported) <= len(stored)
