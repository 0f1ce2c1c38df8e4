"""JAGG against plain autograd: Theorem 1, routing, counting, and each fast path's equivalence."""

import types

import pytest
import torch

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.cost import make_groups, num_routed_groups
from jagg_engine.credit import aggregate_upstream, interpolation_weights
from jagg_engine.grpo import ppo_clip_loss
from jagg_engine.jagg import UpdateConfig, group_plan, policy_update, run_single_group
from jagg_engine.sde import SamplerConfig, Trajectory, make_sigmas, rollout

F64 = torch.float64


def flat_grad(params):
    return torch.cat(
        [p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten() for p in params]
    )


def zero(params):
    for p in params:
        p.grad = None


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def sde_rollout(model, sampler, batch=4, seed=0, cond=None, perturb=0.05):
    """A rollout, with old log-probs nudged so that ratios ≠ 1 and some samples are clipped."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    traj = rollout(
        model, cond, torch.randn(batch, *model.latent_shape, generator=g, dtype=dtype), sampler, generator=g
    )
    traj.log_probs = traj.log_probs + perturb * torch.randn(
        traj.log_probs.shape, generator=g, dtype=traj.log_probs.dtype
    )
    adv = torch.randn(batch, generator=g, dtype=F64)
    return traj, adv


def velocities_and_upstreams(model, traj, adv, sampler, clip_range, steps) -> tuple[list, torch.Tensor]:
    """A group's velocities v̂_j (with their graph) and every s_j = ∂L/∂v̂_j by plain autograd on the group's full
    graph, L = (1/K) Σ_{j ∈ steps} L_j. Shapes: W × (B, N, C) and (W, B, N, C)."""
    K = len(traj.sde_steps)
    vs = [model(traj.latents[j], traj.sigmas[j].expand(traj.batch_size), traj.cond) for j in steps]
    total = 0
    for j, v in zip(steps, vs):
        out = sampler.step(v, traj.latents[j], j, traj.sigmas, prev_sample=traj.latents[j + 1])
        total = total + ppo_clip_loss(out.log_prob, traj.log_probs[j], adv, clip_range)[0] / K
    return vs, torch.stack(torch.autograd.grad(total, vs, retain_graph=True))


def jagg_by_definition(model, traj, adv, sampler, clip_range, steps, alpha_scale=1.0):
    """JAGG's surrogate of one group written out: v̂_0ᵀ s_base + v̂_{W−1}ᵀ s_corr, with the s_j of
    :func:`velocities_and_upstreams` and α from the steps' σ, the inner ones times ``alpha_scale``. Its gradient
    is G_jagg of the group."""
    vs, s = velocities_and_upstreams(model, traj, adv, sampler, clip_range, steps)
    alpha = interpolation_weights(traj.sigmas[steps])
    alpha = torch.cat([alpha[:1], alpha_scale * alpha[1:-1], alpha[-1:]])
    s_base = sum((1 - a) * s_j for a, s_j in zip(alpha, s))
    s_corr = sum(a * s_j for a, s_j in zip(alpha, s))
    return (vs[0] * s_base).sum() + (vs[-1] * s_corr).sum()


def plain_autograd_loss(model, traj, adv, sampler, clip_range, steps):
    """(1/K) Σ_{j ∈ steps} L_j written out directly: one forward per step, no engine code but the SDE step."""
    K = len(traj.sde_steps)
    total = 0
    for j in steps:
        v = model(traj.latents[j], traj.sigmas[j].expand(traj.batch_size), traj.cond)
        out = sampler.step(v, traj.latents[j], j, traj.sigmas, prev_sample=traj.latents[j + 1])
        loss, _ = ppo_clip_loss(out.log_prob, traj.log_probs[j], adv, clip_range)
        total = total + loss / K
    return total


# ---------------------------------------------------------------------------------------------- pure math


def test_alpha_from_timesteps_by_hand():
    alpha = interpolation_weights(torch.tensor([1.0, 0.9, 0.7, 0.4], dtype=F64))
    torch.testing.assert_close(alpha, torch.tensor([0.0, 1 / 6, 0.5, 1.0], dtype=F64))


def test_aggregate_upstream_by_hand():
    s = torch.tensor([[1.0], [2.0], [4.0]], dtype=F64)[:, None, :]  # (W=3, B=1, 1)
    alpha = torch.tensor([0.0, 0.25, 1.0], dtype=F64)
    s_base, s_corr = aggregate_upstream(s, alpha)
    assert s_base.item() == pytest.approx(1 * 1 + 0.75 * 2 + 0 * 4)
    assert s_corr.item() == pytest.approx(0 * 1 + 0.25 * 2 + 1 * 4)


def test_groups_and_routing():
    assert make_groups(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [num_routed_groups(5, f) for f in (0.0, 0.01, 0.6, 1.0)] == [0, 1, 3, 5]
    plan = group_plan(list(range(9)), UpdateConfig(window=4, jagg_frac=1.0))
    assert [k for _, k in plan] == ["jagg", "jagg", "exact"]  # a trailing 1-step group is exact
    plan = group_plan(list(range(12)), UpdateConfig(window=4, jagg_frac=0.6, strategy="endpoint"))
    assert [k for _, k in plan] == ["endpoint", "endpoint", "exact"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"window": 1}, "window"),
        ({"jagg_frac": 1.5}, "jagg_frac"),
        ({"strategy": "fast"}, "strategy"),
        ({"endpoint_backward": "both"}, "endpoint_backward"),
        ({"clip_range": 0}, "clip_range"),
    ],
)
def test_update_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        UpdateConfig(**kwargs)


# ---------------------------------------------------------------------------------------------- Theorem 1


@pytest.mark.parametrize("window", [2, 3, 4, 8])
@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
def test_theorem1_linear_toy_any_sde_trajectory(window, shift, kind):
    """(i) ∂v/∂θ affine in t, independent of z ⇒ JAGG = exact on any SDE rollout, per group."""
    model = LinearToy()
    params = model.trainable_parameters()
    sampler = SamplerConfig(kind=kind, num_steps=17, shift=shift, eta=0.7)
    traj, adv = sde_rollout(model, sampler)
    update = UpdateConfig(window=window, clip_range=0.05)
    groups = make_groups(traj.sde_steps, window)
    assert any(len(g) == window for g in groups)
    for steps in groups:
        grads = {}
        for kind_ in ("exact", "jagg"):
            zero(params)
            run_single_group(model, traj, adv, update, sampler, steps, kind_)
            grads[kind_] = flat_grad(params)
        assert grads["exact"].norm() > 0
        assert rel_err(grads["jagg"], grads["exact"]) <= 1e-9


def line_trajectory(model, window, shift, on_line, seed=0, batch=3):
    """A group of W trained steps whose inputs z_j lie on the line z_j = (1 − α_j)z_0 + α_j z_{W−1} (or not)."""
    g = torch.Generator().manual_seed(seed)
    sampler = SamplerConfig(num_steps=window + 1, shift=shift, sde_window=(0, window))
    sigmas = make_sigmas(window + 1, shift)
    alpha = interpolation_weights(sigmas[:window])
    z0, zl = (torch.randn(batch, 16, generator=g, dtype=F64) for _ in range(2))
    latents = [(1 - a) * z0 + a * zl for a in alpha]
    if not on_line:
        latents[1:-1] = [z + 0.5 * torch.randn(z.shape, generator=g, dtype=F64) for z in latents[1:-1]]
    latents += [torch.randn(batch, 16, generator=g, dtype=F64), torch.zeros(batch, 16, dtype=F64)]
    latents = torch.stack(latents)  # (T + 1, B, D)
    log_probs = torch.zeros(window + 1, batch, dtype=F64)
    with torch.no_grad():
        for j in range(window):
            v = model(latents[j], sigmas[j].expand(batch))
            log_probs[j] = sampler.step(v, latents[j], j, sigmas, prev_sample=latents[j + 1]).log_prob
    log_probs[:window] += 0.05 * torch.randn(window, batch, generator=g, dtype=F64)
    traj = Trajectory(latents, log_probs, sigmas, list(range(window)), None)
    return traj, sampler, torch.randn(batch, generator=g, dtype=F64)


def jagg_vs_exact(model, traj, adv, sampler, window):
    params = model.trainable_parameters()
    update = UpdateConfig(window=window, clip_range=0.05)
    out = {}
    for kind in ("exact", "jagg"):
        zero(params)
        run_single_group(model, traj, adv, update, sampler, traj.sde_steps, kind)
        out[kind] = flat_grad(params)
    return rel_err(out["jagg"], out["exact"])


@pytest.mark.parametrize("window", [2, 3, 4, 8])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_theorem1_trained_a_needs_the_straight_line(window, shift):
    """(ii) A trained: ∂v/∂A is linear in z, so JAGG is exact when the group's z_j are on the straight line."""
    model = LinearToy(train_a=True)
    traj, sampler, adv = line_trajectory(model, window, shift, on_line=True)
    assert jagg_vs_exact(model, traj, adv, sampler, window) <= 1e-9


@pytest.mark.parametrize("window", [3, 4, 8])
def test_theorem1_condition_is_real_off_the_line(window):
    model = LinearToy(train_a=True)
    traj, sampler, adv = line_trajectory(model, window, 3.0, on_line=False)
    assert jagg_vs_exact(model, traj, adv, sampler, window) > 1e-3


# ---------------------------------------------------------------------------------------------- against plain autograd


def flux64_rollout(prompts: list[str]) -> tuple:
    """A float64 TinyFlux, its SDE rollout of ``prompts`` (8 steps, shift 3, perturbed), advantages, sampler."""
    model = TinyFlux(dtype=F64)
    sampler = SamplerConfig(num_steps=8, shift=3.0)
    traj, adv = sde_rollout(model, sampler, cond=model.encode_prompts(prompts), perturb=0.01)
    return model, traj, adv, sampler


@pytest.fixture(scope="module")
def tiny_flux64():
    return flux64_rollout(["a red circle", "a blue square", "a cat", "a dog"])


def test_exact_equals_plain_autograd(tiny_flux64):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    zero(params)
    plain_autograd_loss(model, traj, adv, sampler, 1e-2, traj.sde_steps).backward()
    expected = flat_grad(params)
    zero(params)
    result = policy_update(model, traj, adv, UpdateConfig(strategy="exact", clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected) <= 1e-12
    assert result.loss == pytest.approx(
        plain_autograd_loss(model, traj, adv, sampler, 1e-2, traj.sde_steps).item()
    )


def test_jagg_equals_its_definition_by_plain_autograd(tiny_flux64):
    """G_jagg = Σ_groups J_0ᵀ s_base + J_{W−1}ᵀ s_corr, with every s_j taken by plain autograd on the full graph."""
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    W = 4
    surrogate = sum(
        jagg_by_definition(model, traj, adv, sampler, 1e-2, steps) for steps in make_groups(traj.sde_steps, W)
    )
    zero(params)
    surrogate.backward()
    expected = flat_grad(params)
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(strategy="jagg", window=W, clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected) <= 1e-10


def test_endpoint_equals_endpoint_losses_by_plain_autograd(tiny_flux64):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    ends = [j for g in make_groups(traj.sde_steps, 4) for j in (g[0], g[-1])]
    zero(params)
    plain_autograd_loss(model, traj, adv, sampler, 1e-2, ends).backward()
    expected = flat_grad(params)
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(strategy="endpoint", window=4, clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected) <= 1e-12


def test_sequential_endpoint_backward_equals_joint(tiny_flux64):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    grads = {}
    for mode in ("joint", "sequential"):
        zero(params)
        policy_update(
            model, traj, adv, UpdateConfig(window=4, endpoint_backward=mode, clip_range=1e-2), sampler
        )
        grads[mode] = flat_grad(params)
    assert rel_err(grads["sequential"], grads["joint"]) <= 1e-10


def test_window2_jagg_equals_exact_tiny_flux(tiny_flux64):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    grads = {}
    for strategy in ("exact", "jagg"):
        zero(params)
        policy_update(model, traj, adv, UpdateConfig(strategy=strategy, window=2, clip_range=1e-2), sampler)
        grads[strategy] = flat_grad(params)
    assert rel_err(grads["jagg"], grads["exact"]) <= 1e-9


def test_jagg_frac_zero_reproduces_exact_bitwise(tiny_flux64):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(strategy="exact"), sampler)
    exact = flat_grad(params)
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(strategy="jagg", jagg_frac=0.0), sampler)
    assert torch.equal(flat_grad(params), exact)


def test_jagg_frac_routes_high_noise_groups(tiny_flux64):
    """jagg_frac = 0.5 of 2 groups: group 0 by JAGG, group 1 exact — the sum of the per-group gradients."""
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    update = UpdateConfig(window=4, jagg_frac=0.5)
    g0, g1 = make_groups(traj.sde_steps, 4)
    zero(params)
    run_single_group(model, traj, adv, update, sampler, g0, "jagg")
    run_single_group(model, traj, adv, update, sampler, g1, "exact")
    expected = flat_grad(params)
    zero(params)
    result = policy_update(model, traj, adv, update, sampler)
    assert result.group_kinds == ["jagg", "exact"]
    assert rel_err(flat_grad(params), expected) <= 1e-12


# ---------------------------------------------------------------------------------------------- counting


class Counting(torch.nn.Module):
    """Counts model calls with and without grad, and backward passes through the model (a parameter hook
    fires once per backward pass that reaches the weights, however many forwards that pass covers)."""

    # The counters live in a plain namespace, not as int attributes of the module: the reuse guard compares a
    # module's plain attributes as settings, and a counter is not one.
    fwd_grad = property(lambda self: self.calls.fwd_grad, lambda self, v: setattr(self.calls, "fwd_grad", v))
    fwd_nograd = property(
        lambda self: self.calls.fwd_nograd, lambda self, v: setattr(self.calls, "fwd_nograd", v)
    )
    backward = property(lambda self: self.calls.backward, lambda self, v: setattr(self.calls, "backward", v))
    batch_sizes = property(
        lambda self: self.calls.batch_sizes, lambda self, v: setattr(self.calls, "batch_sizes", v)
    )

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.latent_shape = inner.latent_shape
        self.calls = types.SimpleNamespace(fwd_grad=0, fwd_nograd=0, backward=0, batch_sizes=[])
        first = inner.trainable_parameters()[0]
        first.register_hook(self._on_backward)

    def _on_backward(self, grad):
        self.backward += 1

    def forward(self, z, t, cond):
        if torch.is_grad_enabled():
            self.fwd_grad += 1
        else:
            self.fwd_nograd += 1
        self.batch_sizes.append(z.shape[0])
        return self.inner(z, t, cond)


@pytest.mark.parametrize("window", [3, 4])
def test_counts_per_group(window):
    inner = TinyFlux()
    cond = inner.encode_prompts(["a", "b"])
    sampler = SamplerConfig(num_steps=window, sde_window=(0, window))  # exactly one group of W
    traj, adv = sde_rollout(inner, sampler, batch=2, cond=cond)
    B = traj.batch_size

    model = Counting(inner)
    policy_update(model, traj, adv, UpdateConfig(strategy="exact", window=window), sampler)
    assert (model.fwd_grad, model.fwd_nograd, model.backward) == (window, 0, window)

    model = Counting(inner)
    result = policy_update(model, traj, adv, UpdateConfig(strategy="jagg", window=window), sampler)
    # one grad forward with both endpoints batched (2B), W − 2 no-grad forwards, ONE backward through the model;
    # computing the s_j ran no model backward (it would have fired the hook)
    assert (model.fwd_grad, model.fwd_nograd, model.backward) == (1, window - 2, 1)
    assert sorted(model.batch_sizes) == sorted([2 * B] + [B] * (window - 2))
    assert (result.counts.forward_grad, result.counts.forward_nograd, result.counts.backward) == (
        1,
        window - 2,
        1,
    )

    model = Counting(inner)
    policy_update(
        model,
        traj,
        adv,
        UpdateConfig(strategy="jagg", window=window, endpoint_backward="sequential"),
        sampler,
    )
    assert (model.fwd_grad, model.fwd_nograd, model.backward) == (2, window - 2, 2)

    model = Counting(inner)
    policy_update(model, traj, adv, UpdateConfig(strategy="endpoint", window=window), sampler)
    assert (model.fwd_grad, model.fwd_nograd, model.backward) == (1, 0, 1)


def test_kl_to_reference_needs_ref_and_changes_the_gradient():
    model = LinearToy()
    ref = LinearToy(seed=1)
    sampler = SamplerConfig(num_steps=8)
    traj, adv = sde_rollout(model, sampler)
    params = model.trainable_parameters()
    with pytest.raises(ValueError, match="^beta"):
        policy_update(model, traj, adv, UpdateConfig(beta=0.1), sampler)
    grads = {}
    for beta in (0.0, 0.1):
        zero(params)
        r = policy_update(model, traj, adv, UpdateConfig(beta=beta, window=4), sampler, ref_model=ref)
        grads[beta] = flat_grad(params)
    assert r.kl > 0 and r.counts.ref_forward == len(traj.sde_steps)
    assert rel_err(grads[0.1], grads[0.0]) > 1e-6
    # Theorem 1 still holds with the KL term (it is part of L_j, so of s_j)
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(beta=0.1, strategy="exact"), sampler, ref_model=ref)
    assert rel_err(grads[0.1], flat_grad(params)) <= 1e-9


def _kl_written_out(model, ref, traj, kind, eta, form):
    """The KL term of every trained step written out from the papers' formulas, not the engine's helpers.

    Means: Flow-GRPO eq. (sde_step_with_logprob), DanceGRPO flux_step, Flow-CPS. Forms: "flow-grpo" divides
    mean((μ − μ_ref)²) by 2·std_dev_t² (the noise scale Flow-GRPO's step returns; for dance η, for cps the step
    std), "gaussian" by 2·std² (the step's variance). Returns the mean over steps of the batch-mean KL.
    """
    sig = traj.sigmas.tolist()
    per_step = []
    for j in traj.sde_steps:
        z, s, sn = traj.latents[j], sig[j], sig[j + 1]
        t = traj.sigmas[j].expand(traj.batch_size)
        with torch.no_grad():
            v, v_ref = model(z, t, None), ref(z, t, None)
        dt = sn - s
        if kind == "flow-grpo":
            g = eta * (s / (1 - (sig[1] if s == 1 else s))) ** 0.5  # std_dev_t, σ = 1 → σ_max = σ_1
            mu = [z * (1 + g**2 / (2 * s) * dt) + w * (1 + g**2 * (1 - s) / (2 * s)) * dt for w in (v, v_ref)]
            std = g * (-dt) ** 0.5
        elif kind == "dance":
            g = eta
            mu = [z + dt * w - 0.5 * eta**2 * (-(z - (1 - s) * (z - s * w)) / s**2) * dt for w in (v, v_ref)]
            std = eta * (-dt) ** 0.5
        else:  # cps
            std = g = sn * torch.sin(torch.tensor(eta * torch.pi / 2, dtype=F64)).item()
            mu = [(1 - sn) * (z - s * w) + (sn**2 - std**2) ** 0.5 * (z + (1 - s) * w) for w in (v, v_ref)]
        denom = 2 * g**2 if form == "flow-grpo" else 2 * std**2
        per_step.append((((mu[0] - mu[1]) ** 2).mean(dim=1) / denom).mean().item())
    return sum(per_step) / len(per_step)


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
@pytest.mark.parametrize("form", ["flow-grpo", "gaussian"])
def test_kl_term_matches_the_formulas_written_out(kind, form):
    model, ref = LinearToy(), LinearToy(seed=1)
    sampler = SamplerConfig(kind=kind, num_steps=6, eta=0.7, shift=3.0)
    traj, adv = sde_rollout(model, sampler)
    result = policy_update(
        model, traj, adv, UpdateConfig(beta=0.1, kl_form=form, strategy="exact"), sampler, ref_model=ref
    )
    assert result.kl == pytest.approx(_kl_written_out(model, ref, traj, kind, 0.7, form), rel=1e-10)


def test_flow_grpo_kl_form_is_the_gaussian_kl_times_the_step():
    """On a uniform T = 12 schedule the Gaussian KL of the flow-grpo SDE is T times Flow-GRPO's term."""
    model, ref = LinearToy(), LinearToy(seed=1)
    sampler = SamplerConfig(num_steps=12)
    traj, adv = sde_rollout(model, sampler)
    kls = {
        form: policy_update(model, traj, adv, UpdateConfig(beta=0.1, kl_form=form), sampler, ref_model=ref).kl
        for form in ("flow-grpo", "gaussian")
    }
    assert kls["gaussian"] == pytest.approx(12 * kls["flow-grpo"], rel=1e-9)
    with pytest.raises(ValueError, match="^kl_form"):
        UpdateConfig(kl_form="closed-form")


# ---------------------------------------------------------------------------------------------- velocity reuse


def test_reuse_rollout_velocity_on_policy_equals_jagg_and_saves_forwards():
    model = TinyFlux()  # float32
    model.eval()
    params = model.trainable_parameters()
    cond = model.encode_prompts(["a", "b", "c"])
    sampler = SamplerConfig(num_steps=12, sde_window=(0, 8))
    g = torch.Generator().manual_seed(3)
    traj = rollout(
        model, cond, torch.randn(3, *model.latent_shape, generator=g), sampler, g, store_velocities=True
    )
    adv = torch.randn(3, generator=g)
    grads, results = {}, {}
    for mode in ("off", "auto"):
        zero(params)
        results[mode] = policy_update(
            model, traj, adv, UpdateConfig(window=4, reuse_rollout_velocity=mode), sampler
        )
        grads[mode] = flat_grad(params)
    assert rel_err(grads["auto"], grads["off"]) <= 1e-6
    n_groups = 2
    assert results["auto"].counts.reused == n_groups * (4 - 2)
    assert results["off"].counts.forward_nograd - results["auto"].counts.forward_nograd == n_groups * (4 - 2)

    # off-policy (the weights were written in place): the stored velocities are never used
    # (every way the policy can change is in tests/test_reuse_guard.py)
    with torch.no_grad():
        params[0].add_(0.01)
    zero(params)
    stale = policy_update(model, traj, adv, UpdateConfig(window=4, reuse_rollout_velocity="auto"), sampler)
    assert stale.counts.reused == 0 and stale.counts.forward_nograd == n_groups * (4 - 2)


# ---------------------------------------------------------------------------------------------- automatic routing


def test_auto_jagg_frac_leading_groups_above_threshold():
    from jagg_engine.credit import auto_jagg_frac

    assert auto_jagg_frac([0.9, 0.8, 0.75], 0.7) == 1.0
    assert auto_jagg_frac([0.9, 0.6, 0.95], 0.7) == pytest.approx(
        1 / 3
    )  # routing stops at the first weak group
    assert auto_jagg_frac([0.5, 0.9], 0.7) == 0.0
    assert auto_jagg_frac([float("nan"), 0.9], 0.7) == 0.0
    for n_groups in range(1, 12):
        for n in range(n_groups + 1):
            assert num_routed_groups(n_groups, n / n_groups) == n


class LateNonlinearToy(torch.nn.Module):
    """v = −z/2 + θ_0 + t·θ_1 + b(t)·θ_2 with b(t) = 100·sin(40t)·relu(0.45 − t): linear in t until t = 0.45,
    strongly nonlinear after — so the late groups' Jacobians are far from the interpolation."""

    latent_shape = (8,)

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.theta = torch.nn.Parameter(torch.randn(3, 8, generator=g, dtype=F64))

    def forward(self, z, t, cond=None):
        bump = 100 * torch.sin(40 * t) * torch.relu(0.45 - t)
        return -0.5 * z + self.theta[0] + t[:, None] * self.theta[1] + bump[:, None] * self.theta[2]

    def trainable_parameters(self):
        return [self.theta]


@pytest.mark.parametrize("model, expected", [(LinearToy(), 1.0), (LateNonlinearToy(), 2 / 3)])
def test_auto_routing_from_the_probe(model, expected):
    from jagg_engine.credit import auto_jagg_frac
    from jagg_engine.probe import probe_groups

    sampler = SamplerConfig(num_steps=12)
    traj, adv = sde_rollout(model, sampler, batch=8)
    update = UpdateConfig(window=4)
    rows, _ = probe_groups(model, model.trainable_parameters(), traj, adv, update, sampler)
    frac = auto_jagg_frac([r.cosine for r in rows], 0.7)
    assert frac == pytest.approx(expected)
    plan = group_plan(traj.sde_steps, UpdateConfig(window=4, jagg_frac=frac))
    assert [k for _, k in plan] == (["jagg"] * 3 if expected == 1.0 else ["jagg", "jagg", "exact"])
