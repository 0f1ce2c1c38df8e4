"""Real faults on real runs: a corrupt, truncated or forged checkpoint on resume; a read-only runs folder
(a read-only bind mount: root ignores chmod); a full disk (a small tmpfs) while a run writes a checkpoint,
an image or its metrics. The README's "What happens when…" table names these tests."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from faults import fill_disk, mount

from jagg_engine import cli
from jagg_engine.rewards.registry import register_reward
from jagg_engine.rewards.simple import brightness_score
from jagg_engine.store import open_store
from jagg_engine.train import checkpoint
from jagg_engine.train.config import load_config
from jagg_engine.train.process import train
from jagg_engine.train.trainer import SPACE_RESERVE

TINY = [
    "prompts_per_step=2",
    "group_size=2",
    "sampling_steps=6",
    "sde_window_end=4",
    "eval_every=0",
    "sample_every=0",
    "probe_every=0",
    "lr=3e-4",
]

FAULT = {"fail_at": None, "fill_at": None, "fill_dir": None, "calls": 0}


@register_reward("test-fault")
def _fault_reward():
    """Brightness, except that the call number ``fail_at`` raises and ``fill_at`` fills the disk first."""

    def score(images, prompts):
        FAULT["calls"] += 1
        if FAULT["calls"] == FAULT["fail_at"]:
            raise RuntimeError("reward service unavailable")
        if FAULT["calls"] == FAULT["fill_at"]:
            fill_disk(Path(FAULT["fill_dir"]))
        return brightness_score(images)

    return score


def arm(**kwargs) -> None:
    FAULT.update(fail_at=None, fill_at=None, fill_dir=None, calls=0)
    FAULT.update(kwargs)


def new_run(runs_dir: Path, *overrides: str) -> int:
    cfg = load_config(None, ["rewards={test-fault: 1.0}", *TINY, *overrides])
    store = open_store(runs_dir)
    run_id = store.create_run(cfg.name, cfg.to_dict(), runs_dir / "run", launcher="cli", pid=os.getpid())
    return run_id


def metrics(runs_dir: Path, run_id: int):
    frame = open_store(runs_dir).metrics_frame(run_id)
    return frame[
        [c for c in frame.columns if not c.startswith(("time/", "memory/"))]
    ]  # measured, not results


# ------------------------------------------------------------------------------------------------ resume


@pytest.mark.slow
def test_resume_refuses_bad_checkpoints_and_ends_like_the_uninterrupted_run(tmp_path):
    """One run, three resumes. Every checkpoint truncated (and a pickle with a payload beside them): the
    resume fails with that NEW error, the history untouched. A flipped 4 KB block in the newest: refused in
    one line naming the file, the older one used, and the run ends with the uninterrupted run's metrics."""
    extra = ["steps=3", "checkpoint_every=1", "keep_checkpoints=3"]
    arm()
    straight = new_run(tmp_path / "a", *extra)
    assert train(straight, str(tmp_path / "a")) == 0
    expected = metrics(tmp_path / "a", straight)

    runs = tmp_path / "b"
    arm(fail_at=3)  # the reward of step 3 raises: checkpoints of steps 1 and 2 are on disk
    run_id = new_run(runs, *extra)
    assert train(run_id, str(runs)) == 1
    store = open_store(runs)
    assert store.get_run(run_id)["error"] == "RuntimeError: reward service unavailable"
    before = metrics(runs, run_id)
    folder = runs / "run" / "checkpoints"
    assert [p.name for p in checkpoint.list_checkpoints(folder)] == ["step_00001", "step_00002"]
    saved = tmp_path / "saved"
    shutil.copytree(folder, saved)

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "payload-ran"),))

    torch.save({"params": [Payload()]}, folder / "step_00003.pt")
    for ckpt in checkpoint.list_checkpoints(folder):
        weights = ckpt / checkpoint.WEIGHTS
        os.truncate(weights, weights.stat().st_size - 4096)
    arm()
    assert train(run_id, str(runs), resume=True) == 1  # the failure handler itself does not crash
    run = store.get_run(run_id)
    assert run["status"] == "failed" and run["error"].startswith(
        "CheckpointError: resume: no intact checkpoint"
    )
    assert "step_00003.pt: pickle checkpoint of an older version, not loaded" in run["error"]
    assert not (tmp_path / "payload-ran").exists()
    assert metrics(runs, run_id).equals(before)  # nothing truncated, nothing restarted

    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    weights = folder / "step_00002" / checkpoint.WEIGHTS
    with weights.open("r+b") as fh:  # 4 KB flipped inside one tensor's data
        fh.seek(weights.stat().st_size // 2)
        block = fh.read(4096)
        fh.seek(weights.stat().st_size // 2)
        fh.write(bytes(b ^ 0xFF for b in block))
    assert train(run_id, str(runs), resume=True) == 0
    assert store.get_run(run_id)["status"] == "finished"
    log = (runs / "run" / "train.log").read_text()
    assert f"checkpoint refused: {weights}: sha256 does not match the manifest (corrupt)" in log
    assert f"resuming from {folder / 'step_00001'}, the newest intact checkpoint" in log
    assert "resuming after step 1" in log
    after = metrics(runs, run_id)
    assert after.equals(expected), (after, expected)  # bit-identical to the uninterrupted run


# ------------------------------------------------------------------------------------------------ read-only


@pytest.fixture
def history(tmp_path) -> Path:
    """A runs folder with two finished runs (metrics, a sample image), written and closed."""
    runs = tmp_path / "runs"
    with open_store(runs) as store:
        for name in ("exact", "jagg"):
            run_dir = runs / f"run-{name}"
            (run_dir / "samples").mkdir(parents=True)
            run_id = store.create_run(name, {"strategy": name, "window": 4, "steps": 2}, run_dir)
            store.set_status(run_id, "running", pid=os.getpid())
            for step in (1, 2):
                store.log_step(run_id, step, {"reward/mean": 0.1 * step, "time/update": 1.0})
            from PIL import Image

            Image.new("RGB", (8, 8)).save(run_dir / "samples" / "0.png")
            store.log_samples(
                run_id,
                2,
                [{"kind": "eval", "prompt": "p", "seed": 0, "reward": 0.2, "path": "samples/0.png"}],
            )
            store.set_status(run_id, "finished")
    return runs


def read_only_view(mounts, source: Path, where: Path) -> Path:
    where.mkdir()
    mounts("--bind", str(source), str(where))
    mount("-o", "remount,bind,ro", str(where))
    with pytest.raises(OSError, match="Read-only file system"):
        (where / "probe").write_text("x")
    return where


def test_read_commands_work_on_a_read_only_runs_folder_and_writes_refuse(history, mounts, tmp_path, capsys):
    ro = read_only_view(mounts, history, tmp_path / "ro")
    assert cli.main(["runs", "--runs-dir", str(ro)]) == 0
    listed = capsys.readouterr().out
    assert "exact" in listed and "jagg" in listed and "finished" in listed

    out = tmp_path / "exports"
    assert cli.main(["export", "1", "--runs-dir", str(ro), "--out", str(out)]) == 0
    assert "0.2" in (out / "run-1-exact.csv").read_text()
    capsys.readouterr()

    for argv, message in [
        (["export", "1", "--runs-dir", str(ro), "--out", str(ro / "exports")], "Read-only file system"),
        (["train", "steps=1", "--runs-dir", str(ro)], f"runs dir: {ro} is read-only; nothing was written"),
        (["train", "--resume", "1", "--runs-dir", str(ro)], "is read-only; nothing was written"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def _handler(demo, name: str):
    return next(f.fn for f in demo.fns.values() if f.api_name == name)


def test_the_apps_history_and_compare_work_on_a_read_only_runs_folder(history, mounts, tmp_path):
    from app import ui

    ro = read_only_view(mounts, history, tmp_path / "ro")
    demo = ui.build_app(ro, background_ticks=False)
    try:
        assert demo.jagg_manager.store.read_only
        table = _handler(demo, "history")()
        assert sorted(table["name"].tolist()) == ["exact", "jagg"] and set(table["status"]) == {"finished"}
        _, _, figure, _, _, frame, diff, pairs, _ = _handler(demo, "compare_runs")([1, 2], 1.8)
        assert frame["final reward"].tolist() == [0.2, 0.2]
        assert (
            "read-only" in _handler(demo, "launch_run")(*ui_form().values(), None)[0]
        )  # None: no gr.Request
        assert "read-only" in _handler(demo, "delete_run")(1, False)[0]
        message, files = _handler(demo, "export_run")(1)
        assert message.startswith("**Error:** cannot write ") and message.endswith(": Read-only file system")
        assert files is None
        assert demo.jagg_manager.tick() == []
    finally:
        demo.jagg_manager.shutdown()


def ui_form() -> dict:
    return {
        "name": "t", "backbone": "tiny-shapes", "model_path": "", "rewards": "brightness: 1",
        "algorithm": "flow-grpo", "window": 4, "jagg_frac": 0.5, "cv_frac": 0.0, "jagg_until_step": 0,
        "strategy": "jagg", "steps": 3,
        "group_size": 4, "lr": 1e-4, "seed": 7, "processes": 1, "overrides": "",
    }  # fmt: skip


def test_a_read_only_view_of_a_database_being_written_reads_its_latest_rows(history, mounts, tmp_path):
    """The -wal and -shm files exist (a writer holds the database open): mode=ro reads through them."""
    with open_store(history) as writer:
        writer.db.conn.execute("PRAGMA wal_autocheckpoint = 0")  # the new rows stay in the WAL file
        run_id = writer.create_run("late", {"strategy": "exact"}, None)
        assert (history / "jagg.db-wal").stat().st_size > 0
        ro = read_only_view(mounts, history, tmp_path / "ro")
        with open_store(ro) as reader:
            assert reader.read_only and reader.get_run(run_id)["name"] == "late"
            with pytest.raises(Exception, match="is read-only: nothing was written"):
                reader.log_step(run_id, 1, {"reward/mean": 1.0})


# ------------------------------------------------------------------------------------------------ disk full


@pytest.mark.slow
def test_disk_full_while_writing_a_checkpoint_fails_the_run_and_leaves_no_partial(mounts, tmp_path, capsys):
    """A 40 MiB runs folder: the step-1 checkpoint (~28 MB) fits, the step-2 one does not."""
    runs = tmp_path / "runs"
    runs.mkdir()
    mounts("-t", "tmpfs", "-o", "size=40m", "tmpfs", str(runs))
    arm()
    run_id = new_run(runs, "steps=3", "checkpoint_every=1")
    assert train(run_id, str(runs)) == 1
    run = open_store(runs).get_run(run_id)
    partial = runs / "run" / "checkpoints" / ".step_00002.partial"
    assert run["status"] == "failed" and run["error"].startswith(f"disk full: {partial}/"), run["error"]
    assert "\n" not in run["error"]
    assert sorted(p.name for p in (runs / "run" / "checkpoints").iterdir()) == ["step_00001"]
    assert not (runs / "run" / SPACE_RESERVE).exists()
    assert checkpoint.load_latest(runs / "run" / "checkpoints").step == 1  # resumable once there is room
    assert metrics(runs, run_id)["step"].tolist() == [1, 2]
    assert cli.main(["runs", "--runs-dir", str(runs)]) == 0
    assert "failed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("what", ["images", "metrics"])
def test_disk_full_while_writing_images_or_metrics_fails_the_run_and_keeps_the_history(
    mounts, tmp_path, capsys, what
):
    """The reward of step 2 fills the runs folder's disk; the next write of the run is an image (sample_every
    = 1) or the step's metrics (SQLite). The run ends failed with that path; `jagg runs` works on the full disk."""
    runs = tmp_path / "runs"
    runs.mkdir()
    mounts("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(runs))
    arm(fill_at=2, fill_dir=str(runs))
    run_id = new_run(runs, "steps=3", "checkpoint_every=0", f"sample_every={1 if what == 'images' else 0}")
    assert train(run_id, str(runs)) == 1
    run = open_store(runs).get_run(run_id)
    if what == "images":
        expected = [runs / "run" / "samples/train/step_00002/0.png"]
    else:  # the metrics (SQLite, or the folder's history log of the same transaction), or, when both still fit
        # in blocks they already hold (the WAL is reused after each step's checkpoint), the final checkpoint
        expected = [runs / "jagg.db", runs / "run" / "history.jsonl"]
        expected.append(runs / "run" / "checkpoints" / ".step_00003.partial" / "weights.safetensors")
    errors = [f"disk full: {path.resolve()}" for path in expected]
    assert run["status"] == "failed" and run["error"] in errors, run["error"]
    assert not list((runs / "run").rglob(".*.tmp"))  # no partial image
    assert not (runs / "run" / SPACE_RESERVE).exists()
    steps = metrics(runs, run_id)["step"].tolist()
    assert (
        steps == [1] if what == "images" else steps == list(range(1, len(steps) + 1))
    )  # no gap, nothing torn
    logged = [json.loads(line) for line in (runs / "run" / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "metrics"] == steps  # the folder and the index agree
    fill_disk(runs)  # full again (the run freed its 1 MiB reserve to record its status)
    assert cli.main(["runs", "--runs-dir", str(runs)]) == 0
    assert "failed" in capsys.readouterr().out


def test_a_full_disk_that_names_no_file_says_where_it_was_raised(tmp_path, monkeypatch, capsys):
    """A write call's OSError carries no path: the CLI's one line then says which function raised it, so a full
    disk nobody can place (seen twice under two pytest workers) says which write it was."""
    import errno

    from jagg_engine import runs_cli

    def write_nowhere(args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runs_cli, "run_runs", write_nowhere)
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(
        "jagg runs: error: disk full: ? (OSError: [Errno 28] No space left on device; raised at "
    )
    assert line.endswith(" in write_nowhere)") and "test_faults.py:" in line and "\n" not in line


def test_an_in_process_run_closes_its_log_when_it_returns(tmp_path):
    """A run's train.log is flushed and closed when train() returns, passed or failed: nothing of it stays
    buffered on the root logger for the next run's start to flush."""
    import logging

    for fail_at, rc in ((None, 0), (1, 1)):
        arm(fail_at=fail_at)
        runs = tmp_path / f"runs-{rc}"
        run_id = new_run(runs, "steps=1")
        assert train(run_id, str(runs)) == rc
        log = Path(open_store(runs).get_run(run_id)["run_dir"]) / "train.log"
        held = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
        assert not [h for h in held if Path(h.baseFilename) == log.resolve()], rc
        assert f"run {run_id}" in log.read_text()  # the last line reached the file


def test_an_earlier_runs_log_on_a_full_disk_does_not_stop_the_next_run(mounts, tmp_path):
    """In one process, a run's train.log handler stays on the root logger until the next run sets up its own;
    closing it flushes what it buffered, which on a full disk raised ENOSPC into the next run's start (the
    two-worker suite's unexplained "disk full: ?"). The next run now starts, and the old handler is gone."""
    import logging

    from jagg_engine.train import process

    full = mounts("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / "full"))
    old = logging.FileHandler(full / "train.log")
    root = logging.getLogger()
    root.addHandler(old)
    try:
        fill_disk(full)
        old.stream.write("x" * 100)  # buffered: the flush that close() makes hits the full disk
        with pytest.raises(OSError):
            old.stream.flush()
        process._setup_logging(tmp_path / "next-run", main=True)
        assert old not in root.handlers and (tmp_path / "next-run" / "train.log").exists()
    finally:
        process._drop_root_handlers()
