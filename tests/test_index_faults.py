"""The index and the run folders agree under every fault (issue 28). Real faults on real runs of the
linear-toy backbone: an app open while `jagg reindex` replaces its index; a history.jsonl with a torn last
line, a garbage line, a line pasted from another run and a flipped byte; a trainer killed by SIGKILL in the
middle of a history line, then resumed; `jagg reindex` killed by SIGKILL between its renames; a truncated
run.json. The README's "What happens when…" table names these tests."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for
from toy import ENV, jagg, toy

from app.runs import RunManager
from jagg_engine import cli
from jagg_engine.store import DB_NAME, HISTORY_FILE, RUN_FILE, open_store, read_history
from jagg_engine.train.config import load_config

TOY = toy(checkpoint_every=2)


def snapshot(runs_dir: Path) -> dict[str, list[dict]]:
    """Every row of the index (runs without run_dir, which is a path)."""
    conn = sqlite3.connect(runs_dir / DB_NAME)
    try:
        out = {}
        for table, order in (("runs", "id"), ("metrics", "run_id, step, key"), ("latest", "run_id, key")):
            cur = conn.execute(f"SELECT * FROM {table} ORDER BY {order}")
            names = [d[0] for d in cur.description]
            out[table] = [{k: v for k, v in zip(names, row) if k != "run_dir"} for row in cur.fetchall()]
        return out
    finally:
        conn.close()


def train_toy(root: Path, steps: int) -> None:
    assert cli.main(["train", *TOY, f"steps={steps}", "--runs-dir", str(root)]) == 0


# ------------------------------------------------------------------------------------------------ an app open


@pytest.mark.slow
def test_a_run_launched_from_an_app_open_during_reindex_is_in_the_new_index(tmp_path):
    """The app (its RunManager and the store it holds) stays open while `jagg reindex` replaces jagg.db; a run
    launched from it afterwards finishes, and both the app and `jagg runs` list it."""
    root = tmp_path / "runs"
    train_toy(root, steps=2)
    app = RunManager(root, max_concurrent=1)
    try:
        assert [r["id"] for r in app.store.list_runs()] == [1]
        inode = os.stat(root / DB_NAME).st_ino
        done = jagg("reindex", "--runs-dir", str(root))
        assert done.returncode == 0 and done.stdout.startswith("reindexed 1 run(s)"), done.stderr
        assert os.stat(root / DB_NAME).st_ino != inode  # a new file: the app had the old one open
        run_id = app.create(load_config(None, [*TOY, "steps=3"]).to_dict())
        assert run_id == 2
        assert app.tick() == [2]
        assert wait_for(lambda: app.store.get_run(2)["status"] in ("finished", "failed"))
        assert app.store.get_run(2)["status"] == "finished", app.store.get_run(2)["error"]
        assert app.store.metrics_frame(2)["step"].tolist() == [1, 2, 3]
        assert [(r["id"], r["status"]) for r in app.store.list_runs()] == [(2, "finished"), (1, "finished")]
    finally:
        app.shutdown()
        app.store.close()
    listed = jagg("runs", "--runs-dir", str(root))
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[2]) for r in rows if r and r[0].isdigit()] == [("2", "finished"), ("1", "finished")]
    (backup,) = root.glob(f"{DB_NAME}.before-reindex-*[0-9]")
    conn = sqlite3.connect(backup)
    assert conn.execute("SELECT id FROM runs").fetchall() == [(1,)]  # nothing went into the old file
    conn.close()


# ------------------------------------------------------------------------------------------------ history lines


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _metrics_line(lines: list[bytes], step: int) -> int:
    return next(
        i for i, raw in enumerate(lines) if b'"kind":"metrics"' in raw and f'"step":{step},'.encode() in raw
    )


def test_reindex_skips_torn_garbage_foreign_and_flipped_lines_and_names_each(tmp_path):
    """Run 1's history.jsonl gets a garbage line, a metrics line of run 2 pasted in, a byte flipped inside
    the line of step 3 and its last line torn (cut in the middle of step 6's line). Reindex lists each of the
    four lines, and every intact step's rows are the original's; steps 3 and 6 are left out, never changed."""
    root = tmp_path / "runs"
    train_toy(root, steps=6)
    train_toy(root, steps=3)
    before = snapshot(root)
    history = root / "run-0001" / HISTORY_FILE
    lines = _lines(history)
    foreign = _lines(root / "run-0002" / HISTORY_FILE)[
        _metrics_line(_lines(root / "run-0002" / HISTORY_FILE), 2)
    ]
    flipped = bytearray(lines[_metrics_line(lines, 3)])
    at = flipped.index(b'"reward/mean":') + len(b'"reward/mean":') + 3  # a digit of the value
    flipped[at] = ord("7") if flipped[at] != ord("7") else ord("1")
    lines[_metrics_line(lines, 3)] = bytes(flipped)
    six = _metrics_line(lines, 6)
    torn = lines[six][: len(lines[six]) // 2]  # the write of step 6 never finished
    lines = (
        lines[: _metrics_line(lines, 2) + 1]
        + [b"\x00garbage \xff{not json\n"]
        + lines[_metrics_line(lines, 2) + 1 : six]
    )
    lines.insert(_metrics_line(lines, 4) + 1, foreign)
    lines.append(torn)
    history.write_bytes(b"".join(lines))
    garbage, pasted = lines.index(b"\x00garbage \xff{not json\n") + 1, lines.index(foreign) + 1
    flip_at = _metrics_line(lines, 3) + 1
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / DB_NAME}{suffix}").unlink(missing_ok=True)

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0, done.stderr
    uid2 = json.loads((root / "run-0002" / RUN_FILE).read_text())["uid"]
    expected = sorted(
        [
            (garbage, "not a JSON record"),
            (pasted, f"of another run ({uid2[:12]})"),
            (flip_at, "checksum does not match"),
            (len(lines), "torn"),
        ]
    )
    listed = ", ".join(f"line {n} ({why})" for n, why in expected)
    assert f"skipped: run 1: 4 history line(s) skipped: {listed}\n" in done.stdout, done.stdout
    assert "run 2:" not in done.stdout
    after = snapshot(root)
    intact = [r for r in before["metrics"] if r["run_id"] == 2 or r["step"] not in (3, 6)]
    assert after["metrics"] == intact
    assert not [r for r in after["metrics"] if r["run_id"] == 1 and r["step"] in (3, 6)]
    assert [r for r in after["runs"] if r["id"] == 2] == [r for r in before["runs"] if r["id"] == 2]
    one = {k: v for k, v in after["runs"][0].items() if k != "last_step"}
    assert one == {k: v for k, v in before["runs"][0].items() if k != "last_step"}
    assert after["runs"][0]["last_step"] == 5


def test_a_line_whose_checksum_itself_is_damaged_is_skipped(tmp_path):
    """A flipped byte inside the ``"crc"`` key of the very first line: no checksum is found, but the line has
    the run's uid (only this version writes it, and always with a checksum), so it is refused, not taken."""
    with open_store(tmp_path) as store:
        run_id, folder = store.create_run_folder("one", {}, launcher="cli")
        store.log_step(run_id, 1, {"reward/mean": 0.5})
    path = folder / HISTORY_FILE
    text = path.read_text()
    path.write_text(text.replace('"crc"', '"crd"', 1))
    got = read_history(path, json.loads((folder / RUN_FILE).read_text())["uid"])
    assert got.skipped == [(1, "checksum missing or damaged")]
    assert [r["kind"] for r in got.records] == ["metrics"]


# ------------------------------------------------------------------------------------------------ a torn write

KILLER = """
import os, signal, sys
from jagg_engine import cli
from jagg_engine.rewards.registry import register_reward

calls = [0]


@register_reward("test-sigkill")
def _sigkill():
    def score(images, prompts):
        calls[0] += 1
        if calls[0] == int(os.environ["KILL_AT_CALL"]):
            if os.environ.get("TEAR"):  # half a history line, as a kill in the middle of its write leaves it
                with open(os.environ["TEAR"], "a") as fh:
                    fh.write('{"kind":"metrics","step":6,"values":{"reward/mean":0.4')
            os.kill(os.getpid(), signal.SIGKILL)
        return images.float().mean(dim=(1, 2, 3)) / 255.0

    return score


sys.exit(cli.main(sys.argv[1:]))
"""


def _with_killer(*args: str, kill_at: int = 0, tear: Path | None = None) -> subprocess.CompletedProcess:
    """`jagg ARGS` with the reward ``test-sigkill`` registered: its ``kill_at``-th call (0: never) first
    appends half a history line to ``tear`` (if given), then SIGKILLs the process."""
    env = {**ENV, "KILL_AT_CALL": str(kill_at), **({"TEAR": str(tear)} if tear else {})}
    return subprocess.run(
        [sys.executable, "-c", KILLER, *args], capture_output=True, text=True, env=env, timeout=300
    )


def _killed(*args: str, kill_at: int, tear: Path | None = None) -> None:
    proc = _with_killer(*args, kill_at=kill_at, tear=tear)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.slow
def test_a_resume_after_a_torn_write_keeps_its_truncation_and_reindex_restores_no_discarded_step(tmp_path):
    """The trainer is killed by SIGKILL while writing step 6's history line (checkpoints at steps 2 and 4);
    `jagg train --resume 1` truncates after step 4 and is killed in step 5. The truncate record starts its own
    line (never glued to the fragment), and reindex brings back exactly the live index: no step 5."""
    root = tmp_path / "runs"
    history = root / "run-0001" / HISTORY_FILE
    _killed(
        "train",
        *TOY,
        "rewards={test-sigkill: 1.0}",
        "steps=8",
        "--runs-dir",
        str(root),
        kill_at=6,
        tear=history,
    )
    assert not history.read_bytes().endswith(b"\n")  # the torn tail is there
    _killed("train", "--resume", "1", "--runs-dir", str(root), kill_at=1)
    with open_store(root) as store:
        store.check_liveness()  # the second trainer is gone too
        assert store.metrics_frame(1)["step"].tolist() == [1, 2, 3, 4]
    uid = json.loads((root / "run-0001" / RUN_FILE).read_text())["uid"]
    parsed = read_history(history, uid)
    assert [r["step"] for r in parsed.records if r["kind"] == "truncate"] == [4]
    torn = b'{"kind":"metrics","step":6,"values":{"reward/mean":0.4\n'  # ended by the next append
    fragment = _lines(history).index(torn) + 1
    assert parsed.skipped == [(fragment, "not a JSON record")]
    live = snapshot(root)

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0, done.stderr
    assert f"skipped: run 1: 1 history line(s) skipped: line {fragment} (not a JSON record)" in done.stdout
    assert snapshot(root) == live
    assert {r["step"] for r in snapshot(root)["metrics"]} == {1, 2, 3, 4}


# ------------------------------------------------------------------------------------------------ a lone checkpoint


@pytest.mark.slow
def test_a_lone_corrupt_checkpoint_ends_resume_in_one_line_and_from_scratch_starts_the_run_over(tmp_path):
    """A run SIGKILLed after its first checkpoint (step 2), a 64-byte block of that checkpoint's weights
    flipped: `jagg train --resume 1` fails the run with one line naming the file and `--from-scratch` (the
    traceback only in train.log); `jagg train --resume 1 --from-scratch` then trains run 1 from step 0 to the
    end, its old steps discarded through the history's truncation (reindex agrees)."""
    root = tmp_path / "runs"
    folder = root / "run-0001"
    _killed("train", *TOY, "rewards={test-sigkill: 1.0}", "steps=6", "--runs-dir", str(root), kill_at=3)
    (lone,) = (folder / "checkpoints").iterdir()
    weights = lone / "weights.safetensors"
    with weights.open("r+b") as fh:
        fh.seek(weights.stat().st_size - 64)
        block = fh.read(64)
        fh.seek(weights.stat().st_size - 64)
        fh.write(bytes(b ^ 0xFF for b in block))
    corrupt = weights.read_bytes()
    with open_store(root) as store:
        first = store.metrics_frame(1)
    assert first["step"].tolist() == [1, 2]

    refused = _with_killer("train", "--resume", "1", "--runs-dir", str(root))

    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.endswith(
        f"ERROR run 1 failed: CheckpointError: resume: no intact checkpoint in {folder / 'checkpoints'}"
        f" (refused: {weights}: sha256 does not match the manifest (corrupt)); start the run over from step 0"
        f" with `jagg train --resume 1 --from-scratch --runs-dir {root}`, or start a new run with its config"
    ), last
    assert "Traceback (most recent call last):" in (folder / "train.log").read_text()
    with open_store(root) as store:
        assert store.get_run(1)["status"] == "failed"
        assert store.get_run(1)["error"].startswith("CheckpointError: resume: no intact checkpoint in ")
        uid = store.uid(1)

    again = _with_killer("train", "--resume", "1", "--from-scratch", "--runs-dir", str(root))

    assert again.returncode == 0, again.stderr
    with open_store(root) as store:
        assert [(r["id"], r["status"], r["uid"]) for r in store.list_runs()] == [(1, "finished", uid)]
        frame = store.metrics_frame(1)
    assert frame["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert frame["reward/mean"].tolist()[:2] == first["reward/mean"].tolist()  # the same steps from step 0
    (aside,) = folder.glob("checkpoints-discarded-*")
    assert (aside / lone.name / "weights.safetensors").read_bytes() == corrupt  # kept aside as it was
    assert sorted(p.name for p in aside.iterdir()) == [lone.name]
    truncates = [
        r["step"] for r in read_history(folder / HISTORY_FILE, uid).records if r["kind"] == "truncate"
    ]
    assert truncates == [-1]
    live = snapshot(root)
    done = jagg("reindex", "--runs-dir", str(root))
    assert done.returncode == 0, done.stderr
    assert snapshot(root) == live


def test_from_scratch_without_resume_is_one_line(tmp_path):
    proc = jagg("train", *TOY, "steps=1", "--from-scratch", "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "jagg train: error: --from-scratch: only with --resume RUN_ID (a new run starts from step 0 anyway)"
    ]
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------ a killed reindex

REINDEX_KILLED = """
import os, signal, sys
from jagg_engine import store

when = sys.argv[2]
real_replace, real_link = os.replace, os.link


def replace(src, dst, *args, **kwargs):
    swap = str(src).endswith(".jagg.db.reindex")
    if swap and when == "before-swap":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst, *args, **kwargs)
    if swap and when == "after-swap":
        os.kill(os.getpid(), signal.SIGKILL)


def link(src, dst, *args, **kwargs):
    real_link(src, dst, *args, **kwargs)
    if when == "after-backup":
        os.kill(os.getpid(), signal.SIGKILL)


os.replace, os.link = replace, link
store.reindex(sys.argv[1])
"""


@pytest.mark.parametrize("when", ["after-backup", "before-swap", "after-swap"])
def test_a_reindex_killed_between_its_renames_leaves_the_old_or_the_new_index(tmp_path, when):
    """`jagg reindex` killed by SIGKILL right after it links the old index aside, just before it renames the
    new one over it, or just after: jagg.db is always there and whole; `jagg runs` lists the run; a second
    reindex finishes."""
    root = tmp_path / "runs"
    train_toy(root, steps=3)
    before = snapshot(root)
    proc = subprocess.run(
        [sys.executable, "-c", REINDEX_KILLED, str(root), when], capture_output=True, env=ENV, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (root / DB_NAME).is_file()
    assert snapshot(root) == before
    listed = jagg("runs", "--runs-dir", str(root))
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert listed.stdout.splitlines()[2].split()[:3] == ["1", before["runs"][0]["name"], "finished"]
    again = jagg("reindex", "--runs-dir", str(root))
    assert again.returncode == 0 and again.stdout.startswith("reindexed 1 run(s)"), again.stderr
    assert snapshot(root) == before


# ------------------------------------------------------------------------------------------------ a lost index


def test_a_missing_index_beside_run_folders_is_one_line_naming_reindex_in_every_command(tmp_path):
    """jagg.db (and its -wal/-shm) deleted, the run folders kept: `jagg runs`, `jagg export`, `jagg train`
    and `jagg train --resume` each end with one line naming the folder and `jagg reindex` (exit 2), and none
    makes a run, a folder or an empty index; the reindex brings the run back."""
    root = tmp_path / "runs"
    train_toy(root, steps=2)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / DB_NAME}{suffix}").unlink(missing_ok=True)
    line = (
        f"{root / DB_NAME}: missing, but {root} holds 1 run folder(s) (run-0001); rebuild it from the run"
        f" folders with `jagg reindex --runs-dir {root}`"
    )
    for args in (
        ["runs"],
        ["export", "1", "--out", str(tmp_path)],
        ["train", *TOY, "steps=1"],
        ["train", "--resume", "1"],
    ):
        proc = jagg(*args, "--runs-dir", str(root))
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.strip().splitlines() == [f"jagg {args[0]}: error: {line}"], (args, proc.stderr)
    assert sorted(p.name for p in root.iterdir()) == [".jagg.db.lock", "run-0001"]
    done = jagg("reindex", "--runs-dir", str(root))
    assert done.returncode == 0 and done.stdout.startswith("reindexed 1 run(s)"), done.stderr


# ------------------------------------------------------------------------------------------------ run.json


def test_a_truncated_run_json_is_rebuilt_from_the_history_and_named(tmp_path):
    """run.json cut in half and jagg.db deleted: reindex rebuilds the run from the run records of its
    history.jsonl (config, status, times), says so in a WARNING line, and the index is as before."""
    root = tmp_path / "runs"
    train_toy(root, steps=3)
    before = snapshot(root)
    run_file = root / "run-0001" / RUN_FILE
    run_file.write_bytes(run_file.read_bytes()[: run_file.stat().st_size // 2])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / DB_NAME}{suffix}").unlink(missing_ok=True)

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0 and done.stdout.startswith("reindexed 1 run(s)"), done.stderr
    warning = [line for line in done.stdout.splitlines() if line.startswith("WARNING: ")]
    assert len(warning) == 1 and warning[0].startswith(f"WARNING: run 1: {run_file}: unreadable (")
    assert warning[0].endswith(f"; rebuilt from its {HISTORY_FILE} (status finished)")
    assert snapshot(root) == before


def test_a_truncated_run_json_without_run_records_keeps_the_row_of_the_old_index(tmp_path):
    """run.json cut in half and the history's run records gone (as an older version wrote it): the run's row
    is kept from the index being replaced, and named; its steps come from the history."""
    root = tmp_path / "runs"
    train_toy(root, steps=3)
    before = snapshot(root)
    folder = root / "run-0001"
    history = folder / HISTORY_FILE
    history.write_bytes(b"".join(raw for raw in _lines(history) if b'"kind":"run"' not in raw))
    (folder / RUN_FILE).write_text('{"format": 1, "id": 1, "na')

    done = jagg("reindex", "--runs-dir", str(root))

    assert done.returncode == 0 and done.stdout.startswith("reindexed 1 run(s)"), done.stderr
    assert f"WARNING: run 1: {folder / RUN_FILE}: unreadable (" in done.stdout
    assert "; its row kept from the previous index (status finished)" in done.stdout
    assert snapshot(root) == before
