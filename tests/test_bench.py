"""`jagg bench`: the cost model by hand, the paper-code baseline against the engine, the CLI in a subprocess."""

import json
import subprocess
import sys

import pytest
import torch

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.bench import SavedActivationMeter, paper_code_update
from jagg_engine.cli import main
from jagg_engine.cost import BENCH_STRATEGIES, cost_model_speedup
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, rollout

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def jagg(*args, timeout=180):
    """The `jagg` entry point in a subprocess, as a user runs it."""
    code = "import sys; from jagg_engine.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )


# -- cost model: exact = n·r, jagg = (n − 2) + 2r, endpoint = 2r, paper-code = n + 2r per routed group


@pytest.mark.parametrize(
    "strategy, expected",
    [
        ("exact", 1.0),
        ("jagg", 7.2 / 5.6),  # 4·1.8 / (2 + 3.6)
        ("jagg-sequential", 7.2 / 5.6),
        ("endpoint", 7.2 / 3.6),
        ("paper-code", 7.2 / 7.6),  # slower than exact at W = 4, r = 1.8
    ],
)
def test_cost_model_w4_by_hand(strategy, expected):
    assert cost_model_speedup(4, 1.8, 1.0, strategy) == pytest.approx(expected, rel=1e-12)
    assert cost_model_speedup(4, 1.8, 1.0, strategy, trained_steps=12) == pytest.approx(expected, rel=1e-12)


def test_cost_model_w8_and_paper_continuous_routing():
    assert cost_model_speedup(8, 1.8, 1.0) == pytest.approx(14.4 / 9.6)  # (8 − 2) + 3.6
    # W·r / (f·(W − 2 + 2r) + (1 − f)·W·r) = 7.2 / (0.6·5.6 + 0.4·7.2)
    assert cost_model_speedup(4, 1.8, 0.6) == pytest.approx(7.2 / 6.24)


def test_cost_model_routing_follows_group_plan():
    # K = 12, W = 4: G = 3 groups, ceil(0.6·3) = 2 routed → (3·7.2) / (2·5.6 + 7.2)
    assert cost_model_speedup(4, 1.8, 0.6, trained_steps=12) == pytest.approx(21.6 / 18.4)
    # K = 16: G = 4, ceil(2.4) = 3 routed → 28.8 / (3·5.6 + 7.2)
    assert cost_model_speedup(4, 1.8, 0.6, trained_steps=16) == pytest.approx(28.8 / 24.0)
    # ceil(0.6·5) must be 3, not 4 (binary round-off): K = 20 → 36 / (3·5.6 + 2·7.2)
    assert cost_model_speedup(4, 1.8, 0.6, trained_steps=20) == pytest.approx(36.0 / 31.2)
    # trailing short groups: K = 10 → [4, 4, 2]; a 2-step group costs 2r under jagg (= exact)
    assert cost_model_speedup(4, 1.8, 1.0, trained_steps=10) == pytest.approx(18.0 / 14.8)
    # K = 9 → [4, 4, 1]; a 1-step group is always exact (r)
    assert cost_model_speedup(4, 1.8, 1.0, trained_steps=9) == pytest.approx(16.2 / 13.0)
    # paper-code pays n + 2r per routed group, the 2-step one included: 7.6 + 7.6 + 5.6
    assert cost_model_speedup(4, 1.8, 1.0, "paper-code", trained_steps=10) == pytest.approx(18.0 / 20.8)
    # f = 0 routes nothing
    assert cost_model_speedup(4, 1.8, 0.0, "paper-code", trained_steps=12) == 1.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(window=1, r=1.8, jagg_frac=1.0), "window"),
        (dict(window=4, r=1.8, jagg_frac=1.5), "jagg_frac"),
        (dict(window=4, r=0.0, jagg_frac=1.0), "r"),
        (dict(window=4, r=1.8, jagg_frac=1.0, strategy="nope"), "strategy"),
        (dict(window=4, r=1.8, jagg_frac=1.0, trained_steps=0), "trained_steps"),
    ],
)
def test_cost_model_rejects_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        cost_model_speedup(**kwargs)


# -- paper-code computes JAGG's gradient


@pytest.fixture(scope="module")
def tiny_flux64():
    model = TinyFlux(dtype=F64)
    cond = model.encode_prompts(["a red circle", "a blue square"])
    sampler = SamplerConfig(num_steps=10, shift=3.0)
    g = torch.Generator().manual_seed(1)
    traj = rollout(model, cond, torch.randn(2, *model.latent_shape, generator=g, dtype=F64), sampler, g)
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g, dtype=F64)
    return model, traj, torch.randn(2, generator=g, dtype=F64), sampler


def flat_grad(params):
    return torch.cat([p.grad.flatten() for p in params])


@pytest.mark.parametrize("window, jagg_frac", [(4, 1.0), (3, 0.6)])
def test_paper_code_gradient_equals_engine_jagg(tiny_flux64, window, jagg_frac):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    update = UpdateConfig(strategy="jagg", window=window, jagg_frac=jagg_frac, clip_range=1e-2)
    grads, results = {}, {}
    updates = {
        "engine": lambda m, t, a, s: policy_update(m, t, a, update, s),
        "paper": paper_code_update(update),
    }
    for name, fn in updates.items():
        for p in params:
            p.grad = None
        results[name] = fn(model, traj, adv, sampler)
        grads[name] = flat_grad(params)
    for p in params:
        p.grad = None
    err = ((grads["paper"] - grads["engine"]).norm() / grads["engine"].norm()).item()
    assert err <= 1e-9
    assert results["paper"].loss == pytest.approx(results["engine"].loss, rel=1e-12)
    assert results["paper"].group_kinds == results["engine"].group_kinds
    # paper-code takes two backward calls per routed group where the joint backward takes one
    n_routed = sum(k == "jagg" for k in results["paper"].group_kinds)
    assert n_routed == 3  # W = 4: [4, 4, 2] all routed; W = 3, f = 0.6: [3, 3, 3, 1], ceil(0.6·4) = 3
    assert results["paper"].counts.backward == results["engine"].counts.backward + n_routed


def test_paper_code_rejects_other_strategies():
    with pytest.raises(ValueError, match="^strategy:"):
        paper_code_update(UpdateConfig(strategy="exact"))


def test_saved_activation_meter_counts_saved_storage_once_and_releases_it():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    with SavedActivationMeter(exclude=[w, x]) as meter:
        h = x @ w  # saves x and w: both excluded
        assert meter.current == 0
        y = h.tanh()  # saves its output: 32·64·4 bytes
        z = y * y  # saves y twice: the same storage, counted once
        assert meter.current == 32 * 64 * 4
        z.sum().backward()
    assert meter.peak == 32 * 64 * 4
    assert meter.current == 0  # the graph's saved tensors were released by backward


# -- the CLI


def test_bench_cli_json_smoke():
    proc = jagg(
        "bench", "--backbone", "tiny-flux", "--window", "4", "--jagg-frac", "1", "--repeats", "2",
        "--steps", "8", "--batch", "2", "--threads", "1", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["backbone"], out["window"], out["jagg_frac"]) == ("tiny-flux", 4, 1.0)
    assert out["r"] > 0
    assert set(out["strategies"]) == set(BENCH_STRATEGIES)
    for name, row in out["strategies"].items():
        assert row["median_s"] > 0, name
        assert row["speedup_vs_exact"] > 0 and row["predicted_speedup"] > 0
        assert row["peak_mem_bytes"] > 0
    assert out["strategies"]["exact"]["predicted_speedup"] == 1.0
    # joint JAGG keeps both endpoints' activations at once; sequential and exact one step's
    mem = {k: v["peak_mem_bytes"] for k, v in out["strategies"].items()}
    assert mem["jagg"] > 1.5 * mem["jagg-sequential"]
    # the counts are the engine's: 2 groups of 4 → 2 batched grad forwards, 4 no-grad forwards, 2 backwards
    counts = out["strategies"]["jagg"]["counts"]
    assert (counts["forward_grad"], counts["forward_nograd"], counts["backward"]) == (2, 4, 2)


def test_micro_batch_memory_stays_flat_as_the_batch_grows():
    """With micro-batches the update's saved activations are those of one micro-batch, whatever the batch."""
    from jagg_engine.bench import bench_backbone

    peaks = {}
    for batch in (4, 8):
        report = bench_backbone("tiny-flux", TinyFlux(), window=4, jagg_frac=1.0, batch=batch, steps=4,
                                micro_batch=2, memory_only=True)  # fmt: skip
        assert set(report["strategies"]) == set(BENCH_STRATEGIES) - {"paper-code"}  # not an engine schedule
        peaks[batch] = {k: v["peak_saved_activation_bytes"] for k, v in report["strategies"].items()}
    whole = bench_backbone(
        "tiny-flux", TinyFlux(), window=4, jagg_frac=1.0, batch=8, steps=4, memory_only=True
    )
    for name, peak in peaks[8].items():
        assert peak == pytest.approx(peaks[4][name], rel=0.1), name
        # micro-batches of 2 hold about a quarter of what the whole batch of 8 holds at once
        assert peak < 0.4 * whole["strategies"][name]["peak_saved_activation_bytes"], name


def test_bench_cli_micro_batch_json():
    proc = jagg(
        "bench", "--backbone", "tiny-flux", "--window", "4", "--repeats", "1", "--steps", "4", "--batch", "4",
        "--micro-batch", "2", "--threads", "1", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["micro_batch"] == 2 and "paper-code" not in out["strategies"]
    # one group of 4 in 2 micro-batches: per micro-batch 1 batched grad forward, 2 no-grad, 1 backward
    counts = out["strategies"]["jagg"]["counts"]
    assert (counts["forward_grad"], counts["forward_nograd"], counts["backward"]) == (2, 4, 2)
    assert all(row["measured_over_predicted"] > 0 for row in out["strategies"].values())


def test_bench_cli_table(capsys):
    assert main(["bench", "--backbone", "tiny-flux", "--repeats", "1", "--steps", "4", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "paper-code" in out and "predicted" in out and "r = " in out


@pytest.mark.parametrize(
    "args, field",
    [
        (["--window", "1"], "window"),
        (["--jagg-frac", "1.5"], "jagg_frac"),
        (["--jagg-frac", "-0.1"], "jagg_frac"),
        (["--jagg-frac", "nan"], "jagg_frac"),
        (["--backbone", "nope"], "backbone"),
        (["--repeats", "0"], "repeats"),
        (["--clock", "sundial"], "clock"),
        (["--backbone", "flux"], "model-path"),
        (["--micro-batch", "0"], "micro_batch"),
        (["--micro-batch", "5", "--batch", "4"], "micro_batch"),
    ],
)
def test_bench_bad_input_one_line_exit_2(capsys, args, field):
    assert main(["bench", "--backbone", "tiny-flux", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"jagg bench: error: {field}:")
    assert captured.out == ""
