"""The trainer through `jagg train`, as the app and users start it: history, checkpoints, resume, cancel."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from polling import spawn, tail, wait_for

from jagg_engine.store import open_store

SMALL = [
    "prompts_per_step=2",
    "group_size=4",
    "sampling_steps=6",
    "sde_window_end=4",
    "eval_num_prompts=4",
    "eval_seeds=[0]",
    "eval_every=3",
    "sample_every=1",
    "probe_every=2",
    "lr=3e-4",
]
SMALL_NO_EVAL = [a for a in SMALL if not a.startswith(("eval_every", "probe_every"))]  # multi-process runs


def jagg(*args, runs_dir, wait=True, timeout=600):
    """`jagg train` in runs_dir: waited for (its output captured), or started in its own session with its
    output in :func:`trainer_log` (a file: a pipe nobody reads while the test polls could fill and block it)."""
    cmd = [sys.executable, "-m", "jagg_engine.cli", "train", *args, "--runs-dir", str(runs_dir)]
    if not wait:
        return spawn(cmd, trainer_log(runs_dir), start_new_session=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def trainer_log(runs_dir) -> Path:
    """Where an unwaited :func:`jagg` writes its output: beside runs_dir, not in it."""
    runs_dir = Path(runs_dir)
    runs_dir.parent.mkdir(parents=True, exist_ok=True)
    return runs_dir.parent / f"{runs_dir.name}-trainer.log"


def steps_logged(store, run_id, key="reward/mean"):
    frame = store.metrics_frame(run_id)
    return [] if frame.empty or key not in frame else frame.loc[frame[key].notna(), "step"].tolist()


def test_three_step_run_writes_history_and_learns_something(tmp_path):
    proc = jagg("steps=3", "checkpoint_every=2", "reuse_rollout_velocity=auto", *SMALL, runs_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    assert run["status"] == "finished" and run["error"] is None
    frame = store.metrics_frame(run["id"])
    assert frame["step"].tolist() == [0, 1, 2, 3]
    for key in (
        "reward/mean",
        "reward/std",
        "loss/policy",
        "loss/approx_kl",
        "loss/clipfrac",
        "grad/norm",
        "lr",
        "time/sampling",
        "time/reward",
        "time/update_forward",
        "time/update_backward",
        "time/update",
        "time/step",
        "time/probe",
        "time/unix",
        "count/forward",
        "count/backward",
    ):
        assert frame.loc[frame.step > 0, key].notna().all(), key
    assert frame.loc[frame.step.isin([0, 3]), "eval/reward/mean"].notna().all()
    # the probe (step 2 below) is its own phase, not reward time; every step, eval included, has a clock time
    assert frame.loc[frame.step == 2, "time/probe"].item() > 0
    assert frame.loc[frame.step == 1, "time/probe"].item() < frame.loc[frame.step == 2, "time/probe"].item()
    assert frame["time/unix"].is_monotonic_increasing and frame["time/unix"].notna().all()
    # JAGG, W = 4 on the 4 trained steps: one group → 1 grad forward, 1 backward a step, and the 2 inner
    # velocities taken from the rollout (reuse_rollout_velocity=auto, one optimizer step per rollout)
    assert frame.loc[frame.step > 0, "count/backward"].tolist() == [1.0, 1.0, 1.0]
    assert frame.loc[frame.step > 0, "count/forward"].tolist() == [1.0, 1.0, 1.0]
    assert frame.loc[frame.step > 0, "count/reused"].tolist() == [2.0, 2.0, 2.0]

    run_dir = Path(run["run_dir"])
    evals = store.samples(run["id"], kind="eval")
    assert {s["step"] for s in evals} == {0, 3} and all((run_dir / s["path"]).is_file() for s in evals)
    assert store.samples(run["id"], kind="train")
    assert {p["step"] for p in store.probes(run["id"])} == {2}
    assert (run_dir / "train.log").read_text().count("step 3 reward") == 1

    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert [c.name for c in checkpoints] == ["step_00002", "step_00003"]
    from jagg_engine.backbones import build_backbone
    from jagg_engine.train import checkpoint

    initial = build_backbone("tiny-shapes").trainable_parameters()
    final = checkpoint.read(checkpoints[-1]).params
    assert len(initial) == len(final)
    assert any(not torch.equal(a.detach(), b) for a, b in zip(initial, final)), "no parameter changed"


def test_the_process_group_is_ended_after_a_barrier(tmp_path):
    """close_process_group: a finished run waits for every rank, then destroys the group; a failed one
    destroys its own at once; in one process (no group) it does nothing."""
    import torch.distributed as dist

    from jagg_engine.train.process import close_process_group

    calls = []

    class Acc:
        def wait_for_everyone(self):
            calls.append(("barrier", dist.is_initialized()))

    close_process_group(Acc(), together=True)
    assert calls == []  # no group: nothing to wait for
    for together, expected in ((True, [("barrier", True)]), (False, [])):
        calls.clear()
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg-{together}", rank=0, world_size=1)
        close_process_group(Acc(), together=together)
        assert calls == expected and not dist.is_initialized()


def test_two_processes_write_one_history(tmp_path):
    proc = jagg(
        "steps=2",
        "eval_every=0",
        "auto_route=true",
        "auto_route_every=2",
        *SMALL_NO_EVAL,
        "--processes",
        "2",
        runs_dir=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # both ranks end the process group together: no gloo abort ("terminate called …", "Aborted") at exit
    assert not re.search(r"abort|terminate", proc.stderr, re.IGNORECASE), proc.stderr[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    assert run["status"] == "finished"
    assert steps_logged(store, run["id"]) == [1, 2]
    log = (Path(run["run_dir"]) / "train.log").read_text()
    assert log.count("step 2 reward") == 1
    # auto routing probed the first rollout and step 2, and the routing it chose is in the history
    assert log.count("auto routing") == 2
    assert {p["step"] for p in store.probes(run["id"])} == {1, 2}
    frame = store.metrics_frame(run["id"])
    assert frame.loc[frame.step > 0, "route/jagg_frac"].between(0, 1).all()


def test_sigkill_then_resume_has_no_gap_and_no_duplicate(tmp_path):
    proc = jagg("steps=8", "checkpoint_every=1", *SMALL, runs_dir=tmp_path, wait=False)
    store = open_store(tmp_path)
    assert wait_for(  # polled often: a step of this size can take well under a second
        lambda: store.list_runs() and len(steps_logged(store, store.list_runs()[0]["id"])) >= 2, every=0.02
    ), tail(trainer_log(tmp_path))
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run, after step 2 or a little later
    proc.wait()
    run_id = store.list_runs()[0]["id"]
    before = store.metrics_frame(run_id)
    done = steps_logged(store, run_id)
    assert done == list(range(1, len(done) + 1)) and 2 <= len(done) < 8, done
    store.check_liveness()
    run = store.get_run(run_id)
    assert run["status"] == "failed"

    resumed = jagg("--resume", str(run_id), runs_dir=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert store.get_run(run_id)["status"] == "finished"
    after = store.metrics_frame(run_id)
    assert after["step"].tolist() == list(range(9))
    assert steps_logged(store, run_id) == list(range(1, 9))
    # rows of the completed steps are intact
    cols = ["step", "reward/mean", "loss/policy"]
    assert before[cols].head(len(done) + 1).equals(after[cols].head(len(done) + 1))


def test_cancel_marks_cancelled_with_a_checkpoint(tmp_path):
    proc = jagg("steps=200", "checkpoint_every=100", *SMALL, runs_dir=tmp_path, wait=False)
    store = open_store(tmp_path)
    assert wait_for(lambda: store.list_runs() and steps_logged(store, store.list_runs()[0]["id"]))
    run_id = store.list_runs()[0]["id"]
    before = len(steps_logged(store, run_id))
    store.request_cancel(run_id)
    # Stops at the next step boundary: counted in steps, not seconds (the machine may be busy).
    assert wait_for(lambda: store.get_run(run_id)["status"] == "cancelled", timeout=180)
    assert len(steps_logged(store, run_id)) <= before + 2  # the step in flight, and one that ended meanwhile
    proc.wait(timeout=60)
    assert list((Path(store.get_run(run_id)["run_dir"]) / "checkpoints").glob("step_*/manifest.json"))


@pytest.mark.parametrize(
    "override, field",
    [
        ("window=1", "window"),
        ("jagg_frac=2", "jagg_frac"),
        ("strategy=fast", "strategy"),
        ("steps=0", "steps"),
        ("rewards={nope: 1}", "rewards"),
        ("windw=3", "windw"),
    ],
)
def test_bad_config_exit_2_one_line_nothing_written(tmp_path, override, field):
    proc = jagg(override, runs_dir=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "jagg.db").exists() or not open_store(tmp_path).list_runs()


def test_non_finite_reward_stops_the_run_and_keeps_the_checkpoint(tmp_path):
    from jagg_engine.rewards.registry import register_reward
    from jagg_engine.train.config import load_config
    from jagg_engine.train.process import train

    calls = {"n": 0}

    @register_reward("test-nan-after-2")
    def _factory():
        def score(images, prompts):
            calls["n"] += 1
            value = float("nan") if calls["n"] > 3 else 0.0  # eval at step 0, then steps 1–2, then NaN
            return torch.full((len(prompts),), value) + torch.arange(len(prompts)) * 0.01

        return score

    cfg = load_config(None, ["steps=4", "checkpoint_every=1", "rewards={test-nan-after-2: 1.0}", *SMALL])
    store = open_store(tmp_path)
    run_id = store.create_run("nan", cfg.to_dict(), tmp_path / "run")
    assert train(run_id, str(tmp_path)) == 1
    run = store.get_run(run_id)
    assert run["status"] == "failed" and "non-finite reward at step 3" in run["error"]
    assert steps_logged(store, run_id) == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step_00002" / "manifest.json").is_file()


def test_training_time_leaves_evals_out_and_goes_on_after_a_resume(tmp_path):
    """time/train_elapsed (the `jagg race` axis): wall time of training only, carried over a crash and resume."""
    from jagg_engine.rewards.registry import register_reward
    from jagg_engine.train.config import load_config
    from jagg_engine.train.process import train

    state = {"calls": 0, "crash": True}

    @register_reward("test-crash-at-step-3")
    def _factory():
        def score(images, prompts):
            state["calls"] += 1  # eval 0, step 1, eval 1, step 2, eval 2, then step 3's rollout
            if state["crash"] and state["calls"] == 6:
                raise RuntimeError("simulated crash")
            return torch.arange(len(prompts), dtype=torch.float32) * 0.01

        return score

    overrides = [
        "steps=4",
        *SMALL,
        "eval_every=1",
        "checkpoint_every=1",
        "rewards={test-crash-at-step-3: 1.0}",
    ]
    cfg = load_config(None, overrides)
    store = open_store(tmp_path)
    run_id = store.create_run("crash", cfg.to_dict(), tmp_path / "run")
    assert train(run_id, str(tmp_path)) == 1
    assert "simulated crash" in store.get_run(run_id)["error"]
    state["crash"] = False
    assert train(run_id, str(tmp_path), resume=True) == 0

    t = store.metrics_frame(run_id).set_index("step")
    elapsed, unix, evals = t["time/train_elapsed"], t["time/unix"], t["time/eval"]
    assert t.index.tolist() == [0, 1, 2, 3, 4] and evals.notna().all()
    assert elapsed.loc[1:].notna().all() and elapsed.loc[1:].is_monotonic_increasing and elapsed[1] > 0
    # Between two steps of one process, the training time holds the step's own phases and leaves the eval
    # between them out: training time + eval fit in the wall time (to the clocks' disagreement, 10 ms), and
    # the training time holds the step (sampling, reward, update), measured inside it.
    for step in (2, 4):
        wall = unix[step] - unix[step - 1]
        trained = elapsed[step] - elapsed[step - 1]
        assert t["time/step"][step] <= trained and trained + evals[step - 1] <= wall + 0.01, step
    # Across the resume the clock goes on from step 2's value; the crashed attempt and the restart are left out.
    assert 0 < elapsed[3] - elapsed[2] < unix[3] - unix[2] - evals[2]


def test_fsdp2_two_processes_train_and_checkpoint_full_weights(tmp_path):
    """fsdp=true shards the transformer with FSDP2 (fully_shard, gloo on CPU) across 2 processes."""
    proc = jagg(
        "steps=2",
        "fsdp=true",
        "eval_every=0",
        "checkpoint_every=1",
        *SMALL_NO_EVAL,
        "--processes",
        "2",
        runs_dir=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    assert run["status"] == "finished" and steps_logged(store, run["id"]) == [1, 2]
    folder = Path(run["run_dir"]) / "checkpoints"
    assert sorted(str(p.relative_to(folder)) for p in folder.glob("step_*/optimizer*.safetensors")) == [
        "step_00001/optimizer_rank0.safetensors",
        "step_00001/optimizer_rank1.safetensors",
        "step_00002/optimizer_rank0.safetensors",
        "step_00002/optimizer_rank1.safetensors",
    ]
    from jagg_engine.backbones import build_backbone
    from jagg_engine.train import checkpoint

    manifest = checkpoint.read_manifest(folder / "step_00002")["files"]
    assert {"optimizer_rank0.json", "optimizer_rank1.json", "weights.safetensors"} <= set(manifest)
    initial = build_backbone("tiny-shapes").trainable_parameters()
    final = checkpoint.read(folder / "step_00002", rank=1).params
    assert [p.shape for p in final] == [p.shape for p in initial]  # full tensors, not shards
    assert any(not torch.equal(a.detach(), b) for a, b in zip(initial, final))


def test_fsdp2_cancel_then_resume_loads_the_sharded_optimizer(tmp_path):
    """A cancelled FSDP2 run resumes from its full-weight checkpoint and per-rank optimizer shards."""
    proc = jagg(
        "steps=8", "fsdp=true", "eval_every=0", "checkpoint_every=1", *SMALL_NO_EVAL, "--processes", "2",
        runs_dir=tmp_path, wait=False,
    )  # fmt: skip
    store = open_store(tmp_path)
    assert wait_for(lambda: store.list_runs() and steps_logged(store, store.list_runs()[0]["id"])), tail(
        trainer_log(tmp_path)
    )
    run_id = store.list_runs()[0]["id"]
    store.request_cancel(run_id)
    assert proc.wait(timeout=300) == 0, tail(trainer_log(tmp_path))
    done = steps_logged(store, run_id)
    assert store.get_run(run_id)["status"] == "cancelled" and done == list(range(1, len(done) + 1))
    assert len(done) < 8, "the run finished before the cancel was seen"
    resumed = jagg("--resume", str(run_id), runs_dir=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"resuming after step {len(done)}"
        in (Path(store.get_run(run_id)["run_dir"]) / "train.log").read_text()
    )
    assert store.get_run(run_id)["status"] == "finished"
    assert steps_logged(store, run_id) == list(range(1, 9))


@pytest.mark.parametrize("strategy", ["exact", "jagg"])
def test_grpo_raises_an_easy_reward(tmp_path, strategy):
    """The whole loop points uphill: with the brightness reward a few GRPO steps brighten the fixed eval images."""
    proc = jagg(
        "steps=5", f"strategy={strategy}", "rewards={brightness: 1.0}", "lr=3e-4", "prompts_per_step=2",
        "group_size=8", "sampling_steps=6", "sde_window_end=4", "eval_every=5", "eval_num_prompts=4",
        "eval_seeds=[0]", "checkpoint_every=100", runs_dir=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = open_store(tmp_path)
    frame = store.metrics_frame(store.list_runs()[0]["id"])
    evals = frame[["step", "eval/reward/mean"]].dropna()
    assert evals["step"].tolist() == [0, 5]
    start, end = evals["eval/reward/mean"].tolist()
    assert end > start + 0.1, (start, end)


def test_prompts_are_read_in_shuffled_epochs() -> None:
    from jagg_engine.train.trainer import epoch_prompt_indices

    n, per = 90, 18  # 5 steps per epoch
    steps = [epoch_prompt_indices(0, s, n, per) for s in range(1, 11)]
    for e in range(2):  # every prompt exactly once in each epoch
        assert sorted(int(i) for s in steps[5 * e : 5 * e + 5] for i in s) == list(range(n))
    assert not (steps[0] == steps[5]).all()  # a fresh permutation each epoch
    assert (epoch_prompt_indices(0, 7, n, per) == steps[6]).all()  # a function of (seed, step): resume-safe
    assert not (epoch_prompt_indices(1, 1, n, per) == steps[0]).all()
    ragged = [epoch_prompt_indices(3, s, 10, 4) for s in (1, 2, 3)]  # a step straddling two epochs
    flat = [int(i) for s in ragged for i in s]
    assert sorted(flat[:10]) == list(range(10)) and len(set(flat[10:])) == 2
