"""The run folder stands on its own and jagg.db is its index; finite or failed. Real faults on real runs of the
linear-toy backbone: the index deleted, its header flipped, a page overwritten, a directory in its place; the
-wal/-shm files deleted under a running app; a checkpoint of another run, or one ahead of the logged steps, on
resume; a gradient made NaN by a test reward; an lr that overflows the weights. The README's "What happens
when…" table names these tests."""

from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from toy import jagg

from jagg_engine import cli
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.rewards.registry import register_reward
from jagg_engine.store import DB_NAME, HISTORY_FILE, RUN_FILE, CorruptIndexError, RunStore, open_store
from jagg_engine.train import checkpoint
from jagg_engine.train.config import TrainConfig, load_config
from jagg_engine.train.process import train

REPO = Path(__file__).resolve().parents[1]
TOY = [
    "backbone=linear-toy",
    "rewards={brightness: 1.0}",
    "prompts_per_step=2",
    "group_size=2",
    "sampling_steps=4",
    "sde_window_end=null",
    "window=2",
    "eval_num_prompts=2",
    "eval_seeds=[0]",
    "sample_every=1",
    "checkpoint_every=1",
    "lr=1e-2",
]
POISON = {"at": None, "calls": 0, "hooks": []}


@register_reward("test-nan-gradient")
def _nan_gradient_reward():
    """Brightness; from call ``at`` on, it also poisons the gradient of the model it scores: a hook on each
    trainable parameter of every live LinearToy turns its gradient into NaN (the loss stays finite)."""

    def score(images, prompts):
        POISON["calls"] += 1
        if POISON["calls"] == POISON["at"]:
            for model in [o for o in gc.get_objects() if isinstance(o, LinearToy)]:
                for p in model.trainable_parameters():
                    POISON["hooks"].append(p.register_hook(lambda g: torch.full_like(g, float("nan"))))
        return images.float().mean(dim=(1, 2, 3)) / 255.0

    return score


def snapshot(runs_dir: Path) -> dict:
    """Every row of the index that the folders must bring back (runs without run_dir, which is a path)."""
    conn = sqlite3.connect(runs_dir / DB_NAME)
    try:
        out = {}
        for table, order in (
            ("runs", "id"),
            ("metrics", "run_id, step, key"),
            ("latest", "run_id, key"),
            ("probes", "run_id, step, batch, group_index, method"),
            ("samples", "run_id, path"),
        ):
            cur = conn.execute(f"SELECT * FROM {table} ORDER BY {order}")
            names = [d[0] for d in cur.description]
            out[table] = [{k: v for k, v in zip(names, row) if k != "run_dir"} for row in cur.fetchall()]
        return out
    finally:
        conn.close()


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A runs folder with a finished run (1: eval, samples, probes, checkpoints), a failed one (2: a NaN
    gradient at step 2) and a queued one the app has not launched (3)."""
    root = tmp_path / "runs"
    assert cli.main(["train", *TOY, "steps=4", "eval_every=2", "probe_every=1", "--runs-dir", str(root)]) == 0
    POISON.update(at=2, calls=0)
    try:
        code = cli.main(
            [
                "train",
                *TOY,
                "steps=4",
                "eval_every=0",
                "rewards={test-nan-gradient: 1.0}",
                "--runs-dir",
                str(root),
            ]
        )
    finally:
        for hook in POISON.pop("hooks"):
            hook.remove()
        POISON["hooks"] = []
    assert code == 1
    with open_store(root) as store:
        store.create_run_folder("waiting", load_config(None, TOY).to_dict(), launcher="app")
    return root


# ------------------------------------------------------------------------------------------------ finite


def test_a_nan_gradient_from_a_test_reward_fails_the_run_in_one_line_and_saves_nothing_non_finite(history):
    store = open_store(history)
    run = store.get_run(2)
    assert run["status"] == "failed"
    assert (
        run["error"]
        == "TrainingError: grad: non-finite gradient (norm nan) at step 2; the step was not applied"
    )
    assert store.metrics_frame(2)["step"].tolist() == [1]  # nothing of step 2
    saved = checkpoint.list_checkpoints(Path(run["run_dir"]) / "checkpoints")
    assert [p.name for p in saved] == ["step_00001"]
    checkpoint.read(saved[0])  # finite (read refuses NaN or inf)


def test_an_lr_that_overflows_the_weights_fails_the_run_and_writes_no_checkpoint(tmp_path, monkeypatch):
    """lr=1e308 forced past validation (config bounds refuse it): AdamW makes every weight inf at step 1."""
    cfg = load_config(None, [*TOY, "steps=3", "eval_every=0"])
    cfg = TrainConfig.from_dict({**cfg.to_dict(), "lr": 1e308})
    monkeypatch.setattr(TrainConfig, "validate", lambda self: self)
    store = open_store(tmp_path)
    run_id, folder = store.create_run_folder("huge-lr", cfg.to_dict(), launcher="cli")
    assert train(run_id, str(tmp_path)) == 1
    run = store.get_run(run_id)
    assert run["status"] == "failed"
    assert (
        run["error"].startswith("TrainingError: weights: ")
        and "non-finite value(s) after the optimizer step of" in run["error"]
    )
    assert "\n" not in run["error"] and "lr 1e+308" in run["error"]
    assert checkpoint.list_checkpoints(folder / "checkpoints") == []
    assert store.metrics_frame(run_id)["step"].tolist() == []


def test_resume_refuses_a_checkpoint_past_the_logged_steps(history, caplog):
    """The index lost the last step's rows and the final status (what a lost WAL leaves): the checkpoint of
    step 4 is ahead of the history, so the resume takes step 3's and trains step 4 again."""
    store = open_store(history)
    store.truncate_after(1, 3)
    store.db.execute("UPDATE runs SET status = 'failed' WHERE id = 1")
    store.db.conn.commit()
    assert train(1, str(history), resume=True) == 0
    log = (history / "run-0001" / "train.log").read_text()
    assert "step_00004: step 4 is past the run's last logged step 3" in log
    assert "resuming from" in log and "step_00003" in log
    assert store.get_run(1)["status"] == "finished"
    assert store.metrics_frame(1)["step"].tolist() == [0, 1, 2, 3, 4]


def test_a_checkpoint_of_another_run_is_refused_on_resume(history):
    """Run 1's checkpoints copied into another run's folder (a reused or copied folder): never loaded."""
    store = open_store(history)
    other, folder = store.create_run_folder("other", store.get_run(1)["config"], launcher="cli")
    shutil.copytree(history / "run-0001" / "checkpoints", folder / "checkpoints")
    store.set_status(other, "failed", error="killed")
    assert train(other, str(history), resume=True) == 1
    run = store.get_run(other)
    assert run["status"] == "failed"
    assert "no intact checkpoint" in run["error"]
    assert f"belongs to run {store.uid(1)}, not to this run ({store.uid(other)})" in run["error"]
    assert store.metrics_frame(other)["step"].tolist() == []


# ------------------------------------------------------------------------------------------------ the index


def test_lost_index_reindex_brings_back_the_same_runs_statuses_and_rows(history):
    before = snapshot(history)
    assert [r["status"] for r in before["runs"]] == ["finished", "failed", "queued"]
    assert len(before["metrics"]) > 50 and before["probes"] and before["samples"]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{history / DB_NAME}{suffix}").unlink(missing_ok=True)
    done = jagg("reindex", "--runs-dir", str(history))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"reindexed 3 run(s), {len(before['metrics'])} metric row(s)")
    assert snapshot(history) == before
    runs = jagg("runs", "--runs-dir", str(history))
    assert runs.returncode == 0 and "finished" in runs.stdout and "failed" in runs.stdout


def test_a_new_run_never_takes_an_existing_folder(tmp_path):
    """An index that lost rows (here: all of them) still numbers a new run above every run-NNNN folder, and a
    folder made meanwhile by someone else moves the id on."""
    (tmp_path / "run-0007").mkdir(parents=True)
    with open_store(tmp_path) as store:
        run_id, folder = store.create_run_folder("a", {}, launcher="cli")
        assert (run_id, folder.name) == (8, "run-0008")
        (tmp_path / "run-0009").mkdir()  # another index on this folder made it
        assert store.create_run_folder("b", {}, launcher="cli")[0] == 10
        assert json.loads((folder / RUN_FILE).read_text())["uid"] == store.uid(8)
        assert store.uid(8) != store.uid(10)


def _flip_header(db: Path) -> None:
    with db.open("r+b") as fh:
        fh.write(bytes(b ^ 0xFF for b in fh.read(16)))


def _overwrite_a_page(db: Path) -> None:
    page = int.from_bytes(db.read_bytes()[16:18], "big")
    with db.open("r+b") as fh:
        fh.seek(2 * page + 8)  # inside the third page: a b-tree page of the history
        fh.write(b"\xa5" * 512)


def _directory(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.mkdir()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault", [_flip_header, _overwrite_a_page, _directory], ids=["header", "page", "directory"]
)
def test_a_corrupt_index_is_one_line_in_every_command_and_reindex_repairs_it(history, fault):
    with open_store(history) as store:
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    fault(history / DB_NAME)
    for args in (["runs"], ["export", "1", "--out", str(history.parent)], ["train", *TOY, "steps=1"]):
        proc = jagg(*args, "--runs-dir", str(history))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0, (args, proc.stdout)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert str(history / DB_NAME) in lines[0] and f"jagg reindex --runs-dir {history}" in lines[0], lines
    assert len(list(history.glob("run-*"))) == 3  # `jagg train` made no run
    done = jagg("reindex", "--runs-dir", str(history))
    assert done.returncode == 0 and "reindexed 3 run(s)" in done.stdout, done.stderr
    assert [r["status"] for r in open_store(history).list_runs()] == ["queued", "failed", "finished"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_app_starts_on_a_corrupt_index_and_shows_the_message(tmp_path):
    import launch
    from app.ui import build_app

    (tmp_path / DB_NAME).mkdir()
    demo = build_app(tmp_path, space_mode=False, background_ticks=False, showcase_dir=None)
    port = _free_port()
    launch.serve(demo, "127.0.0.1", port, prevent_thread_lock=True)
    try:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60).read().decode()
        config = urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=60).read().decode()
    finally:
        demo.close()
    assert "<html" in page.lower()
    message = (
        f"{tmp_path / DB_NAME}: is not a file; the run index is unusable: rebuild it from the run folders"
    )
    assert message in config
    assert demo.jagg_index_error.endswith(f"`jagg reindex --runs-dir {tmp_path}`")


def test_runs_piped_into_head_prints_no_traceback(tmp_path):
    with open_store(tmp_path) as store:
        for i in range(400):  # 400 rows of 200+ characters: more than a pipe holds
            store.create_run(f"run-{i}-" + "x" * 200, {"backbone": "linear-toy"}, None)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = f"{sys.executable} -m jagg_engine.cli runs --runs-dir {tmp_path} | head -n 2"
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.startswith("id ") and len(proc.stdout.splitlines()) == 2
    assert proc.stderr == "", proc.stderr


# ------------------------------------------------------------------------------------------------ the WAL


APP = """
import sys, time
from app.ui import build_app
demo = build_app(sys.argv[1], space_mode=False, showcase_dir=None)
print("RUN", demo.jagg_manager.create(dict(__import__("json").loads(sys.argv[2]))), flush=True)
time.sleep(3600)
"""


def _logged_steps(folder: Path) -> list[int]:
    """The steps the trainer itself reported in its log (not the index, not the history file)."""
    return [
        int(line.split(" step ")[1].split()[0])
        for line in (folder / "train.log").read_text().splitlines()
        if " reward " in line and " step " in line
    ]


def _run_file(folder: Path) -> dict:
    try:
        return json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_wal_deleted_under_a_running_app_loses_no_run_and_no_folder_is_reused(tmp_path):
    """The app runs a 30-step training; its -wal and -shm files are deleted mid-run; a `jagg train` then
    makes a new run. That run gets a new folder and its own checkpoints; the first run finishes; after the
    app stops, `jagg reindex` brings back both runs with every step their trainers logged."""
    root = tmp_path / "runs"
    cfg = load_config(None, [*TOY, "steps=30", "eval_every=0", "sample_every=0", "checkpoint_every=5"])
    cfg = TrainConfig.from_dict({**cfg.to_dict(), "output_dir": str(root)})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    app = subprocess.Popen(
        [sys.executable, "-c", APP, str(root), json.dumps(cfg.to_dict())],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        line = app.stdout.readline()
        while line and not line.startswith("RUN "):
            line = app.stdout.readline()
        assert line.strip() == "RUN 1"
        first = root / "run-0001"
        deadline = time.time() + 300
        while (
            time.time() < deadline and len(_logged_steps(first) if (first / "train.log").exists() else []) < 5
        ):
            time.sleep(0.2)
        for suffix in ("-wal", "-shm"):
            Path(f"{root / DB_NAME}{suffix}").unlink()
        new = jagg("train", *TOY, "steps=3", "eval_every=0", "--runs-dir", str(root))
        assert new.returncode == 0, new.stderr[-2000:]
        assert "run 2: " in new.stderr and str(root / "run-0002") in new.stderr
        deadline = time.time() + 300
        while time.time() < deadline and _run_file(first).get("status") != "finished":
            time.sleep(0.5)
        assert _run_file(first).get("status") == "finished"
    finally:
        os.killpg(app.pid, 9)
        app.wait()
    second = root / "run-0002"
    uids = {folder: _run_file(folder)["uid"] for folder in (first, second)}
    assert uids[first] != uids[second]
    for folder in (first, second):  # each folder's checkpoints are its own run's
        for path in checkpoint.list_checkpoints(folder / "checkpoints"):
            assert checkpoint.read_manifest(path)["run_uid"] == uids[folder]
        assert "resuming" not in (folder / "train.log").read_text()
    done = jagg("reindex", "--runs-dir", str(root))
    assert done.returncode == 0, done.stderr
    store = open_store(root)
    assert {r["id"]: r["status"] for r in store.list_runs()} == {1: "finished", 2: "finished"}
    for run_id, folder in ((1, first), (2, second)):
        frame = store.metrics_frame(run_id)
        assert frame["step"].tolist() == _logged_steps(folder) == list(range(1, 31 if run_id == 1 else 4))
        assert store.uid(run_id) == uids[folder]


def test_deleting_the_wal_of_a_writer_that_stays_open_loses_no_logged_step(tmp_path):
    """The WAL is checkpointed after every step: a writer logs 20 steps and keeps its connection open, its
    -wal/-shm files are deleted, and a new reader sees every step."""
    script = (
        "import sys, time\n"
        "from jagg_engine.store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "run_id, _ = store.create_run_folder('w', {}, launcher='cli')\n"
        "store.set_status(run_id, 'running')\n"
        "for step in range(1, 21):\n"
        "    store.log_step(run_id, step, {'reward/mean': step / 10})\n"
        "print('logged', flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert writer.stdout.readline().strip() == "logged"
        for suffix in ("-wal", "-shm"):
            Path(f"{tmp_path / DB_NAME}{suffix}").unlink()
        store = RunStore(tmp_path / DB_NAME)
        assert store.metrics_frame(1)["step"].tolist() == list(range(1, 21))
        assert store.get_run(1)["status"] == "running"
    finally:
        writer.kill()
        writer.wait()
    lines = (tmp_path / "run-0001" / HISTORY_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records if r["kind"] == "metrics"] == list(range(1, 21))


def test_a_corrupt_index_raises_one_line_naming_the_way_out(tmp_path):
    (tmp_path / DB_NAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(CorruptIndexError) as info:
        open_store(tmp_path)
    assert "\n" not in str(info.value) and f"jagg reindex --runs-dir {tmp_path}" in str(info.value)
