"""Past one machine: `jagg train` on two "machines" on the loopback, a missing machine, ranks that agree on
routing, data-parallel gradients against one process, the probe's parameters, the SLURM script."""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from docs_pages import section as docs_section

from jagg_engine.store import open_store
from jagg_engine.train import checkpoint
from jagg_engine.train.launch import free_port

ROOT = Path(__file__).parents[1]
README_ADDRESS = "10.0.0.1:29500"


def scale_commands() -> tuple[list[str], list[list[str]]]:
    """The `jagg train` commands of the docs' "Running at scale" page: (one machine, [machine 0, machine 1])."""
    blocks = re.findall(r"```bash\n(.*?)```", docs_section("Running at scale"), re.S)
    commands = [
        [shlex.split(line) for line in b.splitlines() if line.startswith("jagg train")] for b in blocks
    ]
    (single,), machines = commands[0], commands[1]
    return single, machines


def start(argv: list[str], runs_dir: Path, log: Path, address: str | None = None) -> subprocess.Popen:
    """``jagg ...`` as written, through this checkout's python, into its own runs folder."""
    assert argv[:2] == ["jagg", "train"], argv
    argv = [a.replace(README_ADDRESS, address) if address else a for a in argv[1:]]
    cmd = [sys.executable, "-m", "jagg_engine.cli", *argv, "--runs-dir", str(runs_dir)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


def history(runs_dir: Path):
    store = open_store(runs_dir)
    (run,) = store.list_runs()
    frame = store.metrics_frame(run["id"])
    return run, frame[
        [c for c in frame.columns if not c.startswith(("time/", "memory/"))]
    ]  # measured, not results


@pytest.mark.slow
def test_readme_two_machines_on_loopback_match_one_machine(tmp_path):
    """README's commands: the two-machine one on the loopback (machine ranks 0 and 1, one process each, gloo)
    writes the same history as the one-machine, two-process one."""
    single, (first, second) = scale_commands()
    assert "--machine-rank" in first and "--machine-rank" in second
    one = start(single, tmp_path / "one", tmp_path / "one.log")
    assert one.wait(timeout=600) == 0, (tmp_path / "one.log").read_text()[-3000:]

    address = f"127.0.0.1:{free_port()}"
    m0 = start(first, tmp_path / "m0", tmp_path / "m0.log", address)
    m1 = start(second, tmp_path / "m1", tmp_path / "m1.log", address)
    assert m0.wait(timeout=600) == 0, (tmp_path / "m0.log").read_text()[-3000:]
    assert m1.wait(timeout=60) == 0, (tmp_path / "m1.log").read_text()[-3000:]
    assert not (tmp_path / "m1" / "jagg.db").exists()  # only machine 0 opens the runs database
    assert not list((tmp_path / "m1").rglob("step_*")) and not list((tmp_path / "m1").rglob("*.png"))

    run_one, one_frame = history(tmp_path / "one")
    run_two, two_frame = history(tmp_path / "m0")
    assert run_one["status"] == run_two["status"] == "finished"
    assert run_two["config"]["processes"] == 2
    assert one_frame["step"].tolist() == two_frame["step"].tolist() == [1, 2]
    assert sorted(one_frame.columns) == sorted(two_frame.columns)
    for key in one_frame.columns:
        a, b = one_frame[key].tolist(), two_frame[key].tolist()
        if key.startswith("reward/"):
            assert a == b, key
        else:
            assert a == pytest.approx(b, rel=0, abs=1e-6), key
    assert (Path(run_two["run_dir"]) / "checkpoints" / "step_00002" / "manifest.json").is_file()


@pytest.mark.slow
def test_cancel_and_resume_across_machines(tmp_path):
    """Two machines on the loopback, cancelled after a step, resumed on both: machine 1 holds no copy of the
    run and no checkpoint; global rank 0 reads the checkpoint and sends it over."""
    # 8 steps: the cancel, asked once step 1 is logged, lands before the last one even on a quiet machine
    small = ["steps=8", "checkpoint_every=1", "prompts_per_step=2", "group_size=4", "sampling_steps=6"]
    small += ["sde_window_end=4", "eval_every=0", "sample_every=0"]

    def both(args0, args1, tag):
        address = f"127.0.0.1:{free_port()}"
        flags = ["--processes", "2", "--machines", "2", "--main-address", address]
        return [
            start(
                [*args, *flags, "--machine-rank", str(rank)],
                tmp_path / f"m{rank}",
                tmp_path / f"{tag}{rank}.log",
            )
            for rank, args in enumerate((args0, args1))
        ]

    procs = both(["jagg", "train", *small], ["jagg", "train", *small], "first")
    m0 = tmp_path / "m0"

    def logged(store, run_id):
        frame = store.metrics_frame(run_id)
        return [] if frame.empty else frame["step"].tolist()

    deadline = time.monotonic() + 600
    while not ((m0 / "jagg.db").exists() and open_store(m0).list_runs() and logged(open_store(m0), 1)):
        assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "first0.log").read_text()
        time.sleep(0.5)
    store = open_store(m0)
    store.request_cancel(1)
    assert [p.wait(timeout=300) for p in procs] == [0, 0], (tmp_path / "first0.log").read_text()[-3000:]
    done = logged(store, 1)
    assert (
        store.get_run(1)["status"] == "cancelled"
        and done == list(range(1, len(done) + 1))
        and done != list(range(1, 9))
    )

    procs = both(["jagg", "train", "--resume", "1"], ["jagg", "train", "--resume", "1"], "resume")
    assert [p.wait(timeout=600) for p in procs] == [0, 0], (tmp_path / "resume0.log").read_text()[-3000:]
    assert store.get_run(1)["status"] == "finished" and logged(store, 1) == list(range(1, 9))
    log = (Path(store.get_run(1)["run_dir"]) / "train.log").read_text()
    assert f"resuming after step {len(done)}" in log
    assert not (tmp_path / "m1" / "jagg.db").exists() and not list((tmp_path / "m1").rglob("step_*"))


@pytest.mark.slow
def test_a_machine_given_another_config_fails_both(tmp_path):
    """Machine 1 checks the config it was given against machine 0's: a difference fails every rank at once."""
    address = f"127.0.0.1:{free_port()}"
    common = ["eval_every=0", "prompts_per_step=2", "--processes", "2", "--machines", "2"]
    common += ["--main-address", address]
    procs = [
        start(["jagg", "train", f"steps={1 + rank}", *common, "--machine-rank", str(rank)], tmp_path / f"m{rank}",
              tmp_path / f"m{rank}.log")
        for rank in (0, 1)
    ]  # fmt: skip
    assert [p.wait(timeout=600) for p in procs] == [1, 1]
    (run,) = open_store(tmp_path / "m0").list_runs()
    assert run["status"] == "failed"
    assert "machine 1 (rank 1): config: differs from machine 0's in steps" in run["error"]


def test_a_missing_machine_ends_the_other_in_time_with_one_line(tmp_path):
    """Machine 0 without machine 1, and machine 1 without machine 0 (another address): each ends at the join
    timeout (the launcher's own output says it timed out) with exit code 1 and one error line naming the
    address and the timeout; machine 0's run reads failed."""
    timeout = 5
    procs = {}
    for rank in (0, 1):
        address = f"127.0.0.1:{free_port()}"
        args = ["jagg", "train", "steps=1", "eval_every=0", "prompts_per_step=2", "--processes", "2"]
        args += ["--machines", "2", "--machine-rank", str(rank), "--main-address", address]
        args += ["--join-timeout", str(timeout)]
        procs[rank] = (address, start(args, tmp_path / f"m{rank}", tmp_path / f"m{rank}.log"))
    for rank, (address, proc) in procs.items():
        rc = proc.wait(timeout=900)  # a hang guard only: how long it took is not asserted (a busy machine)
        stderr = (tmp_path / f"m{rank}.log").read_text()
        assert rc == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
        assert len(errors) == 1, stderr[-3000:]
        assert errors[0].startswith("jagg train: error: main-address:") and address in errors[0], errors
        assert f"within {timeout} s" in errors[0] and stderr.rstrip().endswith(errors[0])
        kept = Path(errors[0].rsplit("launcher output: ", 1)[1].rstrip(")"))
        assert "Timed out" in kept.read_text() or "timed out" in kept.read_text()
    store = open_store(tmp_path / "m0")
    (run,) = store.list_runs()
    assert run["status"] == "failed" and procs[0][0] in run["error"]
    assert not (tmp_path / "m1" / "jagg.db").exists()


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory) -> dict:
    """tests/dist/data_parallel.py under `accelerate launch`, 2 processes (gloo)."""
    out = tmp_path_factory.mktemp("data-parallel") / "result.json"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(free_port()), str(ROOT / "tests/dist/data_parallel.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["exact", "jagg"])
def test_two_process_gradients_equal_one_process_of_the_same_batch(data_parallel, strategy):
    result = data_parallel[strategy]
    assert data_parallel["world"] == 2 and result["batch"] == 8
    assert result["norm"] > 1e-3
    assert result["max_abs_diff"] <= 1e-6, result
    assert result["local_max_abs_diff"] > 1e-4  # one rank's gradient alone is not the batch's


@pytest.mark.slow
def test_ranks_agree_on_routing_and_the_log_says_which(data_parallel):
    r = data_parallel["routing"]
    assert r["status"] == "finished"
    (c0, c1) = (r["cosines"][0][0], r["cosines"][1][0])
    assert min(c0, c1) < r["threshold"] < max(c0, c1)  # deciding on its own rollout, each rank would differ
    assert r["own_fracs"][0] != r["own_fracs"][1]
    used0, used1 = r["used"]
    assert len(used0) == len(used1) == 2
    assert used0 == used1 == r["logged"]
    assert r["probe_steps"] == [1, 2]


def test_probe_is_taken_at_the_parameters_before_the_step(tmp_path, monkeypatch):
    """The logged probe of step 1 equals a direct probe of the same rollout at the pre-step parameters, and
    not the one at the parameters after the step."""
    import jagg_engine.train.process as process_mod
    import jagg_engine.train.trainer as trainer_mod
    from jagg_engine.probe import probe_groups
    from jagg_engine.train.config import load_config

    seen = {}
    real = trainer_mod.policy_update

    def recording(model, traj, advantages, update, sampler, *args, **kw):
        params = model.trainable_parameters()
        seen.update(traj=traj, adv=advantages.clone(), before=[p.detach().clone() for p in params])
        return real(model, traj, advantages, update, sampler, *args, **kw)

    monkeypatch.setattr(trainer_mod, "policy_update", recording)
    cfg = load_config(
        None,
        ["steps=1", "prompts_per_step=2", "group_size=4", "sampling_steps=6", "sde_window_end=6", "window=3"]
        + ["sde_window_schedule=fixed"]  # two groups of 3, one probe row each
        + ["eval_every=0", "sample_every=0", "probe_every=1", "lr=1e-2", "grad_clip=null"],
    )
    store = open_store(tmp_path)
    run_id = store.create_run("probe", cfg.to_dict(), tmp_path / "run")
    assert process_mod.train(run_id, str(tmp_path)) == 0
    logged = sorted(store.probes(run_id), key=lambda p: p["group_index"])
    assert [p["step"] for p in logged] == [1, 1]

    model = trainer_mod.build_model(cfg, torch.device("cpu"))
    params = model.trainable_parameters()
    after = checkpoint.read(tmp_path / "run" / "checkpoints" / "step_00001").params

    def direct(values):
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        n = min(8, seen["traj"].batch_size)
        rows, _ = probe_groups(
            model, params, seen["traj"].select(slice(0, n)), seen["adv"][:n], cfg.update_config(),
            cfg.sampler_config(),
        )  # fmt: skip
        return rows

    before_rows, after_rows = direct(seen["before"]), direct(after)
    assert any(not torch.equal(a, b) for a, b in zip(seen["before"], after))
    for p, b in zip(logged, before_rows):
        assert p["cosine"] == pytest.approx(b.cosine, abs=1e-12)
        assert p["rel_error"] == pytest.approx(b.rel_error, rel=1e-9)
    # the check can fail: the parameters after the step give another rel_error
    assert max(abs(p["rel_error"] - a.rel_error) for p, a in zip(logged, after_rows)) > 1e-6


def test_slurm_script_starts_one_jagg_train_per_node_with_its_rank(tmp_path):
    """scripts/slurm/jagg-train.sbatch with stand-ins for scontrol, srun (one task per node, SLURM_NODEID set)
    and jagg (prints its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "scontrol": 'printf "gpu-a17\\ngpu-b03\\n"',
        "srun": 'for n in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$n "${@:6}"; done',
        "jagg": 'echo "$@"',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_NNODES": "2"}
    env.update(SLURM_JOB_NODELIST="gpu-[a17,b03]", SLURM_GPUS_ON_NODE="4")
    script = ROOT / "scripts/slurm/jagg-train.sbatch"
    proc = subprocess.run(
        ["bash", str(script), "configs/flux-lora.yaml", "steps=100"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        args = shlex.split(line)
        assert args[:3] == ["train", "configs/flux-lora.yaml", "steps=100"]
        flag = {args[i]: args[i + 1] for i in range(3, len(args) - 1, 2)}
        assert flag["--machine-rank"] == str(rank) and flag["--machines"] == "2"
        assert flag["--processes"] == "8" and flag["--main-address"] == "gpu-a17:29500"
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--machines", "2", "--processes", "2"], "main-address"),
        (["--machines", "2", "--machine-rank", "2", "--main-address", "h:1"], "machine-rank"),
        (["--machines", "2", "--main-address", "nohost", "--processes", "2"], "main-address"),
        (["--machines", "2", "--main-address", "h:1", "--processes", "3"], "processes"),
        (["--accelerate-config", "acc.yaml", "--machines", "2"], "accelerate-config"),
        (["--join-timeout", "0"], "join-timeout"),
    ],
)
def test_bad_machine_flags_exit_2_one_line_nothing_written(tmp_path, capsys, flags, field):
    from jagg_engine.cli import main

    argv = ["train", "steps=1", "prompts_per_step=6", *flags, "--runs-dir", str(tmp_path)]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jagg train: error: {field}:"), lines
    assert not (tmp_path / "jagg.db").exists()


def test_accelerate_config_file_is_passed_through(tmp_path):
    """--accelerate-config: the machines come from accelerate's own file, which goes to `accelerate launch`."""
    from jagg_engine.train.launch import _topology_from_accelerate_config, accelerate_argv

    path = tmp_path / "machine1.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\nmachine_rank: 1\n"
        "num_processes: 16\nmain_process_ip: 10.0.0.1\nmain_process_port: 29500\nmixed_precision: bf16\n"
    )
    topo = _topology_from_accelerate_config(str(path))
    assert (topo.processes, topo.machines, topo.machine_rank, topo.address) == (16, 2, 1, "10.0.0.1:29500")
    argv = accelerate_argv(topo.processes, None, "runs", False, topo, join_timeout=42)
    launch = argv[argv.index("accelerate.commands.launch") + 1 : argv.index("-m", 3)]
    assert launch == ["--config_file", str(path), "--rdzv_conf", "timeout=42"]  # nothing overrides the file
    trainer = argv[argv.index("jagg_engine.train.process") + 1 :]
    assert trainer == ["--runs-dir", "runs", "--machine-rank", "1"]  # the run id comes from machine 0

    flags = accelerate_argv(2, 7, "runs", True, topology_of(2, 2, 0, "10.0.0.1", 29500), join_timeout=5)
    for a, b in [("--num_machines", "2"), ("--machine_rank", "0"), ("--main_process_ip", "10.0.0.1")]:
        assert flags[flags.index(a) + 1] == b
    assert flags[flags.index("--main_process_port") + 1] == "29500" and "--multi_gpu" in flags
    assert flags[-5:] == ["--machine-rank", "0", "--run-id", "7", "--resume"]


def topology_of(processes, machines, rank, host, port):
    from jagg_engine.train.launch import Topology

    return Topology(processes, machines, rank, host, port)
