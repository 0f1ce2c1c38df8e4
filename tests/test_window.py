"""Windowed GRPO: the sliding SDE window (its schedule, and the JAGG update at every position against plain
autograd), the shared group prefix, and the dpmpp-2m solver outside the window against diffusers' scheduler."""

import os
import signal

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler
from test_jagg import Counting, flat_grad, jagg_by_definition, plain_autograd_loss, rel_err, sde_rollout, zero
from test_micro_batch import PerSample, TokenMLP

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import (
    SamplerConfig,
    make_sigmas,
    ode_segment,
    respace,
    rollout,
    set_flow_sigmas,
    sliding_window,
)
from jagg_engine.train.config import ConfigError, load_config

F64 = torch.float64


# ---------------------------------------------------------------------------------------------- the schedule


def test_sliding_window_positions_by_hand():
    # first 0, last start 4, W 4, a shift every 2 steps of stride 2: 0, 0, 2, 2, 4, 4, then back to 0
    starts = [sliding_window(s, 0, 4, 4, 2, 2)[0] for s in range(1, 9)]
    assert starts == [0, 0, 2, 2, 4, 4, 0, 0]
    assert sliding_window(3, 0, 4, 4, 2, 2) == (2, 6)
    # a stride that does not reach the last start exactly stops before it: 1, 4, 7, then back to 1
    assert [sliding_window(s, 1, 8, 3, 1, 3)[0] for s in range(1, 6)] == [1, 4, 7, 1, 4]
    with pytest.raises(ValueError, match="sliding window"):
        sliding_window(0, 0, 4, 4, 1, 1)


def test_config_window_at_each_step():
    cfg = load_config(
        None,
        [
            "sampling_steps=12",
            "sde_window_start=1",
            "sde_window_end=9",
            "window=4",
            "sde_window_schedule=sliding",
            "window_shift_every=3",
            "window_stride=2",
        ],
    )
    # starts 1, 3, 5 (= 9 − 4, the last that fits), each for 3 steps, then back to 1
    assert [cfg.sde_window_at(s) for s in (1, 3, 4, 7, 9, 10)] == [
        (1, 5),
        (1, 5),
        (3, 7),
        (5, 9),
        (5, 9),
        (1, 5),
    ]
    assert cfg.sampler_config(4).sde_steps() == [3, 4, 5, 6]
    capped = cfg.apply_overrides(["window_last_start=3"]).validate()
    assert [capped.sde_window_at(s)[0] for s in (1, 4, 7)] == [1, 3, 1]
    # ODE steps are capped at the schedule's own count on each side of the window
    fewer = cfg.apply_overrides(["ode_steps_before=2", "ode_steps_after=5"]).validate()
    assert len(fewer.sampler_config(1).grid().sigmas) - 1 == 1 + 4 + 5  # window 1-5: 1 step before, 7 after
    assert len(fewer.sampler_config(7).grid().sigmas) - 1 == 2 + 4 + 3  # window 5-9: 5 before, 3 after
    fixed = cfg.apply_overrides(["sde_window_schedule=fixed"]).validate()
    assert fixed.sde_window_at(7) == (1, 9) and fixed.sampler_config(7).sde_steps() == list(range(1, 9))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["sde_window_schedule=moving"], "sde_window_schedule"),
        (["group_noise=same"], "group_noise"),
        (["ode_solver=heun"], "ode_solver"),
        (["ode_steps_after=0"], "ode_steps_after"),
        (["ode_steps_before=-1"], "ode_steps_before"),
        (["window_stride=0"], "window_stride"),
        (["window_shift_every=0"], "window_shift_every"),
        (["sde_window_schedule=fixed", "window_last_start=2"], "window_last_start"),  # fixed: not used
        (["sde_window_schedule=sliding", "window_last_start=5"], "window_last_start"),  # 8 − 4 = 4 at most
    ],
)
def test_window_fields_refused_in_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["sde_window_end=8", "window=4", *overrides])
    message = str(info.value)
    assert message.startswith(f"{field}:") and "\n" not in message, message


# ---------------------------------------------------------------------------------------------- gradient


POSITIONS = [sliding_window(s, 0, 6, 4, 1, 1) for s in range(1, 8)]  # every start 0 … 6 of T = 10, W = 4


@pytest.fixture(scope="module")
def tiny_flux64_model():
    model = TinyFlux(dtype=F64)
    return model, model.encode_prompts(["a red circle", "a blue square", "a cat", "a dog"])


@pytest.mark.parametrize("window", POSITIONS, ids=[f"{a}-{b}" for a, b in POSITIONS])
def test_sliding_window_theorem1_jagg_is_the_exact_window_gradient(window):
    """Theorem 1 (∂v/∂θ affine in t, independent of z) at every window position, with dpmpp-2m outside it:
    the one JAGG group of the window gives the exact group gradient of that window."""
    model = LinearToy()
    params = model.trainable_parameters()
    sampler = SamplerConfig(num_steps=10, shift=3.0, sde_window=window, ode_solver="dpmpp-2m")
    traj, adv = sde_rollout(model, sampler)
    assert len(traj.sde_steps) == 4
    grads = {}
    for strategy in ("exact", "jagg"):
        zero(params)
        policy_update(model, traj, adv, UpdateConfig(strategy=strategy, window=4, clip_range=0.05), sampler)
        grads[strategy] = flat_grad(params)
    assert grads["exact"].norm() > 0
    assert rel_err(grads["jagg"], grads["exact"]) <= 1e-9


@pytest.mark.parametrize("window", POSITIONS, ids=[f"{a}-{b}" for a, b in POSITIONS])
def test_sliding_window_update_equals_plain_autograd_at_every_position(tiny_flux64_model, window):
    """A transformer at every window position, the ODE part re-spaced and solved by dpmpp-2m: exact equals the
    window's loss by plain autograd, JAGG equals its definition J_0ᵀ s_base + J_{W−1}ᵀ s_corr by plain
    autograd, and the window costs ONE joint backward (counted on the model) — with reuse, no inner forward."""
    inner, cond = tiny_flux64_model
    sampler = SamplerConfig(
        num_steps=10,
        shift=3.0,
        sde_window=window,
        ode_solver="dpmpp-2m",
        ode_steps_before=2,
        ode_steps_after=2,
    )
    traj, adv = sde_rollout(inner, sampler, cond=cond, perturb=0.01)
    params = inner.trainable_parameters()
    steps, K = traj.sde_steps, len(traj.sde_steps)
    assert K == 4 and torch.equal(traj.sigmas[steps], sampler.sigmas(F64)[window[0] : window[1]])

    zero(params)
    plain_autograd_loss(inner, traj, adv, sampler, 1e-2, steps).backward()
    expected_exact = flat_grad(params)
    zero(params)
    policy_update(inner, traj, adv, UpdateConfig(strategy="exact", window=4, clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected_exact) <= 1e-12

    zero(params)
    jagg_by_definition(inner, traj, adv, sampler, 1e-2, steps).backward()
    expected_jagg = flat_grad(params)

    model = Counting(inner)
    zero(params)
    result = policy_update(
        model, traj, adv, UpdateConfig(strategy="jagg", window=4, clip_range=1e-2), sampler
    )
    assert rel_err(flat_grad(params), expected_jagg) <= 1e-10
    assert (model.fwd_grad, model.fwd_nograd, model.backward) == (1, 2, 1)  # one group: one joint backward
    assert result.group_kinds == ["jagg"]


@pytest.mark.parametrize("window", POSITIONS[::3], ids=[f"{a}-{b}" for a, b in POSITIONS[::3]])
def test_sliding_window_with_reuse_counts_match_the_plan(window):
    """With reuse on policy a window costs 2r: one grad forward of both endpoints, one backward, the W − 2
    inner velocities taken from the rollout (no forward), and the gradient is the recomputing one's."""
    inner = TinyFlux()
    inner.eval()
    model = Counting(inner)  # the object that samples is the one that updates: reuse is provably on policy
    cond = inner.encode_prompts(["a", "b", "c"])
    sampler = SamplerConfig(num_steps=10, sde_window=window, ode_solver="dpmpp-2m", ode_steps_after=2)
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(3, *inner.latent_shape, generator=g)
    traj = rollout(model, cond, noise, sampler, g, store_velocities=True)
    adv = torch.randn(3, generator=g)
    params = inner.trainable_parameters()
    grads = {}
    for mode in ("off", "auto"):
        model.fwd_grad = model.fwd_nograd = model.backward = 0
        model.batch_sizes = []
        zero(params)
        result = policy_update(model, traj, adv, UpdateConfig(window=4, reuse_rollout_velocity=mode), sampler)
        grads[mode] = flat_grad(params)
        counts = (result.counts.forward_grad, result.counts.forward_nograd, result.counts.backward)
        if mode == "auto":
            assert result.counts.reused == 2 and counts == (1, 0, 1)
            # on the model: the guard's one-sample no-grad forward, ONE grad forward of both endpoints (2B), ONE
            # backward
            assert (model.fwd_grad, model.fwd_nograd, model.backward) == (1, 1, 1)
            assert sorted(model.batch_sizes) == [1, 6]
        else:
            assert result.counts.reused == 0 and counts == (1, 2, 1)
    assert rel_err(grads["auto"], grads["off"]) <= 1e-6


@pytest.mark.parametrize("group", [None, 3])
def test_rollout_keeps_only_the_velocities_reuse_reads(group):
    """The trainer's rollout keeps v̂_j only at the inner steps of its JAGG groups (:func:`reuse_steps`): the
    same latents and log-probs as keeping all, those velocities bit-equal, the update's gradient and counts the
    same as with every velocity kept — and asking for a step that was not kept is refused."""
    from jagg_engine.jagg import reuse_steps

    inner = TinyFlux()
    inner.eval()
    cond = inner.encode_prompts(["a"] * 3 + ["b"] * 3 if group else ["a", "b"] * 3)
    sampler = SamplerConfig(num_steps=10, sde_window=(2, 8), ode_solver="dpmpp-2m", ode_steps_before=1)
    update = UpdateConfig(window=3, reuse_rollout_velocity="auto")
    g0 = torch.Generator().manual_seed(1)
    noise = torch.randn(2 if group else 6, *inner.latent_shape, generator=g0)
    noise = noise.repeat_interleave(3, 0) if group else noise
    steps = sampler.grid().sde_steps
    keep = reuse_steps(steps, update)
    assert keep == [steps[1], steps[4]]  # two groups of three: their middle steps
    trajs = {}
    for mode in ("all", "inner"):
        g = torch.Generator().manual_seed(7)
        store = True if mode == "all" else keep
        trajs[mode] = rollout(inner, cond, noise, sampler, g, store_velocities=store, prefix_group=group)
    full, kept = trajs["all"], trajs["inner"]
    assert torch.equal(full.latents, kept.latents) and torch.equal(full.log_probs, kept.log_probs)
    assert kept.velocities.shape[0] == 2 and full.velocities.shape[0] == len(full.sigmas) - 1
    for j in keep:
        assert torch.equal(kept.velocity(j), full.velocity(j))
    with pytest.raises(ValueError, match=f"velocity of step {steps[0]}: not kept"):
        kept.velocity(steps[0])
    adv = torch.randn(6, generator=g0)
    params = inner.trainable_parameters()
    grads, counts = {}, {}
    for mode, traj in trajs.items():
        zero(params)
        result = policy_update(inner, traj, adv, update, sampler)
        grads[mode], counts[mode] = flat_grad(params), result.counts
    assert counts["inner"].reused == counts["all"].reused == 2
    assert counts["inner"].forward_nograd == counts["all"].forward_nograd == 0
    assert torch.equal(grads["inner"], grads["all"])
    # a strategy that reads none keeps none
    assert reuse_steps(steps, UpdateConfig(strategy="exact", window=3)) == []
    assert reuse_steps(steps, UpdateConfig(window=2, reuse_rollout_velocity="auto")) == []


# ---------------------------------------------------------------------------------------------- shared prefix


def shared_noise(G=3, prompts=2, seed=0, shape=(6, 8)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(prompts, *shape, generator=g).repeat_interleave(G, 0)  # (prompts·G, *S)


@pytest.mark.parametrize("solver", ["euler", "dpmpp-2m"])
def test_shared_prefix_is_bit_identical_to_per_sample_sampling(solver):
    """Per-sample arithmetic (one sample per model call): computing the prefix once per group and broadcasting
    it gives the very bits of sampling every sample's prefix itself, with the same SDE noise after it."""
    G = 3
    model = PerSample(TokenMLP(dtype=torch.float32))
    noise = shared_noise(G)
    cond = torch.randn(noise.shape[0] // G, 4, generator=torch.Generator().manual_seed(1)).repeat_interleave(
        G, 0
    )
    sampler = SamplerConfig(num_steps=10, sde_window=(4, 8), ode_solver=solver, ode_steps_before=3)
    out = {}
    for group in (None, G):
        g = torch.Generator().manual_seed(5)
        out[group] = rollout(model, cond, noise, sampler, g, store_velocities=True, prefix_group=group)
    for name in ("latents", "log_probs", "velocities"):
        assert torch.equal(getattr(out[G], name), getattr(out[None], name)), name
    # the group's samples share the prefix and differ after the window's first SDE step
    first = out[G].sde_steps[0]
    assert torch.equal(out[G].latents[first, 0], out[G].latents[first, 1])
    assert not torch.equal(out[G].latents[first + 1, 0], out[G].latents[first + 1, 1])


def test_shared_prefix_forwards_drop_by_the_group_size():
    """Counted on the model: the prefix's samples forwarded drop by G; the rollout's count agrees."""
    G, prompts = 4, 2
    inner = TokenMLP(dtype=torch.float32)
    noise = shared_noise(G, prompts)
    B = noise.shape[0]
    cond = torch.randn(B // G, 4).repeat_interleave(G, 0)  # one prompt a group
    sampler = SamplerConfig(num_steps=10, sde_window=(5, 9))  # 5 prefix steps, 4 SDE, 1 after
    seen = {}
    for group in (None, G):
        model = Counting(inner)
        traj = rollout(model, cond, noise, sampler, torch.Generator().manual_seed(0), prefix_group=group)
        seen[group] = (sum(model.batch_sizes), traj.forwards)
    assert seen[None] == (10 * B, 10.0)
    assert seen[G] == (5 * B // G + 5 * B, 5 / G + 5)
    assert seen[None][0] - seen[G][0] == 5 * B * (G - 1) // G  # prefix sample-forwards: 5·B → 5·B / G


def test_shared_prefix_refuses_a_group_of_several_prompts():
    cond = torch.randn(2, 4).repeat_interleave(3, 0)
    cond[4] += 1e-3  # sample 4 of group 1 has its own prompt
    with pytest.raises(ValueError, match="one conditioning"):
        rollout(
            TokenMLP(dtype=torch.float32),
            cond,
            shared_noise(3),
            SamplerConfig(num_steps=6, sde_window=(2, 4)),
            prefix_group=3,
        )


def test_shared_prefix_refuses_noise_that_is_not_shared():
    noise = shared_noise(3)
    noise[1] += 1e-3
    with pytest.raises(ValueError, match="group_noise"):
        rollout(
            TokenMLP(dtype=torch.float32),
            torch.randn(6, 4),
            noise,
            SamplerConfig(num_steps=6, sde_window=(2, 4)),
            prefix_group=3,
        )


# ---------------------------------------------------------------------------------------------- dpmpp-2m


def toy_velocity(z, t, cond=None):
    """A nonlinear, time-dependent velocity field (no parameters): v = tanh(z)·(1 + t) − 0.5·t²·z."""
    t = t.reshape(-1, *([1] * (z.dim() - 1))).to(z.dtype)
    return torch.tanh(z) * (1 + t) - 0.5 * t**2 * z


def scheduler_reference(z, sigmas):
    """The segment σ_0 … σ_n solved by diffusers' own ``DPMSolverMultistepScheduler.step`` loop, every latent."""
    options = dict(
        algorithm_type="dpmsolver++", solver_order=2, use_flow_sigmas=True, prediction_type="flow_prediction"
    )
    if sigmas[-1] > 0:  # a part before the window: second order to its end
        options.update(final_sigmas_type="sigma_min", lower_order_final=False)
    scheduler = DPMSolverMultistepScheduler(**options)
    set_flow_sigmas(scheduler, sigmas)
    out = [z]
    for i, t in enumerate(scheduler.timesteps):
        v = toy_velocity(z, sigmas[i].expand(z.shape[0]))
        z = scheduler.step(v, t, z).prev_sample
        out.append(z)
    return torch.stack(out)


@pytest.mark.parametrize(
    "window, before, after", [((0, 4), None, None), ((3, 7), None, None), ((3, 7), 2, 3), ((6, 10), 4, None)]
)
def test_dpmpp_2m_outside_the_window_matches_diffusers_step_for_step(window, before, after):
    """float64, a toy velocity field: every latent of both ODE segments equals diffusers' scheduler run on that
    segment's σ to ≤ 1e-6; inside the window the SDE steps are the sampler's own."""
    sampler = SamplerConfig(
        num_steps=12,
        shift=3.0,
        sde_window=window,
        ode_solver="dpmpp-2m",
        ode_steps_before=before,
        ode_steps_after=after,
    )
    noise = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(0), dtype=F64)
    traj = rollout(toy_velocity, None, noise, sampler, torch.Generator().manual_seed(1))
    a, b = traj.sde_steps[0], traj.sde_steps[-1] + 1
    T = len(traj.sigmas) - 1
    assert T == (window[0] if before is None else before) + 4 + ((12 - window[1]) if after is None else after)
    if a > 0:
        ref = scheduler_reference(noise, traj.sigmas[: a + 1])
        assert (traj.latents[: a + 1] - ref).abs().max() <= 1e-6
    if b < T:
        ref = scheduler_reference(traj.latents[b], traj.sigmas[b:])
        assert (traj.latents[b:] - ref).abs().max() <= 1e-6
        assert not torch.allclose(
            ref[-1],
            traj.latents[b] + (0 - traj.sigmas[b]) * toy_velocity(traj.latents[b], traj.sigmas[b].expand(3)),
        )


def test_dpmpp_2m_at_half_the_steps_is_closer_than_euler_on_a_toy_field():
    """On the toy field from σ = 1 to 0, against an RK4 reference of 2000 steps: Euler's error halves with its
    step (first order, which checks the reference), and dpmpp-2m at n/2 steps is closer than Euler at n."""
    noise = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0), dtype=F64)

    def field(z, sigma):
        return toy_velocity(z, torch.full((4,), float(sigma), dtype=F64))

    def final(solver, n):
        """The ODE from σ = 1 to 0 in n uniform steps, one segment of ``solver``."""
        sigmas, z = make_sigmas(n, 1.0, F64), noise.clone()
        segment = ode_segment(solver, sigmas, 0, n)
        for j in range(n):
            z = segment.step(field(z, sigmas[j]), z, j)
        return z

    sigmas, ref = make_sigmas(2000, 1.0, F64), noise.clone()
    for a, b in zip(sigmas[:-1], sigmas[1:]):  # classical RK4
        h = b - a
        k1 = field(ref, a)
        k2 = field(ref + h / 2 * k1, a + h / 2)
        k3 = field(ref + h / 2 * k2, a + h / 2)
        k4 = field(ref + h * k3, b)
        ref = ref + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    err = {(s, n): (final(s, n) - ref).norm().item() for s in ("euler", "dpmpp-2m") for n in (8, 16, 32, 64)}
    for n in (16, 32, 64):
        assert 1.8 < err["euler", n // 2] / err["euler", n] < 2.2
        assert err["dpmpp-2m", n // 2] < err["euler", n]


def test_respace_keeps_the_endpoints_and_is_the_schedule_of_the_segment():
    sigmas = make_sigmas(12, 3.0)
    assert torch.equal(respace(sigmas, 3, 9, 6, 3.0), sigmas[3:10])  # same count: the schedule itself
    torch.testing.assert_close(respace(sigmas, 0, 12, 24, 3.0), make_sigmas(24, 3.0), rtol=0, atol=1e-12)
    half = respace(sigmas, 0, 12, 6, 3.0)
    torch.testing.assert_close(half, make_sigmas(6, 3.0), rtol=0, atol=1e-12)  # every other point
    seg = respace(sigmas, 8, 12, 3, 3.0)
    assert seg[0] == sigmas[8] and seg[-1] == sigmas[12] and (seg[:-1] > seg[1:]).all()


# ---------------------------------------------------------------------------------------------- the trainer

WINDOWED = [
    "sde_window_schedule=sliding",
    "window=2",
    "window_shift_every=1",
    "group_noise=shared",
    "ode_solver=dpmpp-2m",
    "ode_steps_after=1",
]


def measured(frame):
    """A run's metrics without its measurements (time/, memory/): what must be bit-identical."""
    return frame[[c for c in frame.columns if not c.startswith(("time/", "memory/"))]]


@pytest.mark.slow
def test_sliding_window_run_killed_and_resumed_is_bit_identical(tmp_path):
    """A sliding-window run (shared prefix, dpmpp-2m after the window) killed with SIGKILL during step 3 and
    resumed logs exactly the metrics of the same run uninterrupted: the window schedule, the prompts and the
    noise are functions of the step. Each step logs its window and its sampling forwards."""
    from polling import tail
    from test_train import SMALL, jagg, steps_logged, trainer_log, wait_for

    from jagg_engine.store import open_store

    quiet = ["eval_every=0", "sample_every=0", "probe_every=0"]
    args = ["steps=12", "checkpoint_every=1", *SMALL, *quiet, *WINDOWED]
    straight = jagg(*args, runs_dir=tmp_path / "a")
    assert straight.returncode == 0, straight.stderr[-3000:]
    store_a = open_store(tmp_path / "a")
    expected = measured(store_a.metrics_frame(store_a.list_runs()[0]["id"]))
    trained = expected[expected.step > 0]
    # window 2 sliding over steps 0-3 of 6 (last start 2), one shift a step, then back to 0
    assert trained["sampler/window_start"].tolist() == [0, 1, 2] * 4
    assert trained["sampler/window_end"].tolist() == [2, 3, 4] * 4
    # forwards per sample: the prefix once per group of 4, the window's 2 steps, 1 dpmpp-2m step after it
    assert trained["count/sampling_forward"].tolist() == [3, 3.25, 3.5] * 4

    proc = jagg(*args, runs_dir=tmp_path / "b", wait=False)
    store = open_store(tmp_path / "b")
    assert wait_for(
        lambda: store.list_runs() and steps_logged(store, store.list_runs()[0]["id"])[-1:] >= [2],
        every=0.05,
    ), tail(trainer_log(tmp_path / "b"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = store.list_runs()[0]["id"]
    assert steps_logged(store, run_id)[-1] < 12  # killed mid-run: the resume has steps left to train
    store.check_liveness()
    resumed = jagg("--resume", str(run_id), runs_dir=tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = measured(store.metrics_frame(run_id))
    assert after.equals(expected), (after, expected)


@pytest.mark.slow
def test_ode_solver_check_script_on_tiny_shapes(tmp_path):
    """README's dpmpp-2m figure, on 2 prompts: at window 0-4 (8 ODE steps after it) dpmpp-2m at 4 is closer to
    the 4×-step Euler images than Euler at 4; where each ODE part has 2 steps the two solvers agree."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location(
        "ode_solver_check", root / "scripts" / "ode_solver_check.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "ode.json"
    argv = [
        str(root / "configs/tiny-shapes-cpu.yaml"),
        "--windows",
        "0-4,4-8",
        "--prompts",
        "2",
        "--json",
        str(out),
    ]
    assert script.main(argv) == 0
    rows = {(r["window"], r["way"]): r for r in json.loads(out.read_text())}
    assert rows["0-4", "dpmpp-2m n/2"]["ode_steps"] == rows["0-4", "euler n/2"]["ode_steps"] == 4
    assert rows["0-4", "dpmpp-2m n/2"]["rms_to_reference"] < rows["0-4", "euler n/2"]["rms_to_reference"]
    assert rows["0-4", "dpmpp-2m n/2"]["closer_than_euler_half"] == 1.0
    assert rows["4-8", "dpmpp-2m n/2"]["rms_to_reference"] == pytest.approx(
        rows["4-8", "euler n/2"]["rms_to_reference"], abs=0.05
    )
