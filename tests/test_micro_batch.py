"""Micro-batches: the update's accumulated gradient and metrics equal the whole batch's, and the rollout's
trajectories do not depend on how the batch is split."""

import pytest
import torch

from jagg_engine.backbones import build_backbone
from jagg_engine.backbones.base import index_cond
from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, rollout
from jagg_engine.shapes_data import all_prompts

B = 5  # micro-batches of 1, 3 (does not divide B: 3 + 2) and B
SAMPLER = SamplerConfig(num_steps=11, shift=3.0, sde_window=(0, 10))  # 10 trained steps: groups 4, 4, 2
TOL = {torch.float32: 1e-6, torch.float64: 1e-10}

CASES = {
    "exact": dict(strategy="exact"),
    "jagg-joint": dict(strategy="jagg"),
    "jagg-sequential": dict(strategy="jagg", endpoint_backward="sequential"),
    "endpoint": dict(strategy="endpoint"),
    "jagg+reuse": dict(strategy="jagg", reuse_rollout_velocity="auto"),
    "jagg-f0.6": dict(strategy="jagg", jagg_frac=0.6),  # groups 4, 4 by JAGG; the trailing 2 exact
    "jagg+reuse-f0.6": dict(strategy="jagg", jagg_frac=0.6, reuse_rollout_velocity="auto"),
    "jagg-kl": dict(strategy="jagg", beta=0.05),
}


class TokenMLP(torch.nn.Module):
    """A small nonlinear velocity field over (B, N, C) tokens with per-sample conditioning — fast enough to run
    every case in both dtypes; :func:`test_tiny_flux_micro_batches` covers a real transformer."""

    def __init__(self, seed=0, dtype=torch.float64, n=6, c=8, hidden=32):
        super().__init__()
        torch.manual_seed(seed)
        self.latent_shape = (n, c)
        self.inp = torch.nn.Linear(c + 1 + 4, hidden, dtype=dtype)
        self.mix = torch.nn.Linear(n, n, dtype=dtype)  # across tokens of one sample
        self.out = torch.nn.Linear(hidden, c, dtype=dtype)

    def forward(self, z, t, cond):
        n = z.shape[1]
        feats = torch.cat(
            [z, t[:, None, None].expand(-1, n, 1).to(z.dtype), cond[:, None].expand(-1, n, -1)], -1
        )
        h = torch.tanh(self.inp(feats))  # (B, N, H)
        h = h + torch.tanh(self.mix(h.transpose(1, 2))).transpose(1, 2)
        return self.out(h)  # (B, N, C)

    def trainable_parameters(self):
        return list(self.parameters())


def flat_grad(params):
    return torch.cat([torch.zeros_like(p).flatten() if p.grad is None else p.grad.flatten() for p in params])


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["fp32", "fp64"])
def setup(request):
    dtype = request.param
    model, ref = TokenMLP(dtype=dtype).eval(), TokenMLP(seed=1, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(B, 4, generator=g, dtype=dtype)
    noise = torch.randn(B, *model.latent_shape, generator=g, dtype=dtype)
    traj = rollout(model, cond, noise, SAMPLER, generator=g, store_velocities=True)
    # nudge the old log-probs so that ratios ≠ 1 and some samples are clipped
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return model, ref, traj, adv, dtype


@pytest.mark.parametrize("case", list(CASES))
def test_micro_batches_give_the_whole_batch_gradient(setup, case):
    model, ref, traj, adv, dtype = setup
    params = model.trainable_parameters()
    grads, results = {}, {}
    for mb in (None, 1, 3, B):
        for p in params:
            p.grad = None
        update = UpdateConfig(window=4, clip_range=1e-2, micro_batch=mb, **CASES[case])
        results[mb] = policy_update(model, traj, adv, update, SAMPLER, ref_model=ref)
        grads[mb] = flat_grad(params)
    whole = results[None]
    assert grads[None].norm() > 0 and whole.clipfrac > 0
    for mb in (1, 3, B):
        assert rel_err(grads[mb], grads[None]) <= TOL[dtype], mb
        r = results[mb]
        for name in ("loss", "approx_kl", "clipfrac", "ratio_mean", "kl"):
            assert getattr(r, name) == pytest.approx(getattr(whole, name), rel=1e-5, abs=1e-9), (mb, name)
        assert r.steps_computed == whole.steps_computed and r.group_kinds == whole.group_kinds
    n_micro = {1: 5, 3: 2, B: 1}
    if "reuse" in case:  # the inner steps of every JAGG group, in every micro-batch
        inner = 2 * 2  # groups 4, 4 have 2 inner steps each; the trailing 2-step group none (f = 1 or 0.6)
        for mb in (1, 3, B):
            assert results[mb].counts.reused == inner * n_micro[mb]
            assert results[mb].counts.forward_nograd == 0
    if case == "exact":  # each micro-batch runs its own model calls
        for mb in (1, 3, B):
            assert results[mb].counts.forward_grad == 10 * n_micro[mb]


def test_tiny_flux_micro_batches():
    """A real (tiny) Flux transformer in float32: JAGG with reuse, micro-batches of 3; every grad call holds
    at most 2 × 3 samples (the joint endpoint forward), every no-grad call at most 3."""
    model = TinyFlux().eval()
    params = model.trainable_parameters()
    sampler = SamplerConfig(num_steps=7, sde_window=(0, 6))  # groups 4, 2
    cond = model.encode_prompts(["a", "b", "c", "d", "e"])
    g = torch.Generator().manual_seed(1)
    traj = rollout(
        model, cond, torch.randn(B, *model.latent_shape, generator=g), sampler, g, store_velocities=True
    )
    adv = torch.randn(B, generator=g)
    grads, sizes = {}, []
    model.register_forward_pre_hook(lambda m, args: sizes.append((torch.is_grad_enabled(), args[0].shape[0])))
    for mb in (None, 3):
        for p in params:
            p.grad = None
        sizes.clear()
        r = policy_update(
            model, traj, adv, UpdateConfig(window=4, micro_batch=mb, reuse_rollout_velocity="auto"), sampler
        )
        grads[mb] = flat_grad(params)
    assert r.counts.reused == 2 * 2
    assert rel_err(grads[3], grads[None]) <= 1e-6
    assert max(n for grad, n in sizes if grad) == 2 * 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_micro_batch_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="^micro_batch: "):
        UpdateConfig(micro_batch=bad)


# ---------------------------------------------------------------------------------------------- rollout


class PerSample(torch.nn.Module):
    """Runs the wrapped model one sample at a time, so that its arithmetic cannot depend on the batch size."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.latent_shape = inner.latent_shape

    def forward(self, z, t, cond):
        return torch.cat(
            [
                self.inner(z[i : i + 1], t[i : i + 1], index_cond(cond, slice(i, i + 1)))
                for i in range(z.shape[0])
            ]
        )


def split_rollouts(model, cond, noise, sizes):
    sampler = SamplerConfig(num_steps=5, sde_window=(0, 4))
    out = {}
    for mb in sizes:
        g = torch.Generator().manual_seed(1)  # as the trainer: one generator per (seed, step, rank)
        out[mb] = rollout(model, cond, noise, sampler, g, store_velocities=True, micro_batch=mb)
        out[mb].rng_after = g.get_state()
    return out


def test_rollout_micro_batches_give_identical_trajectories():
    """The SDE noise is drawn for the whole batch before any model call, so the split changes nothing: with a
    model whose arithmetic is per sample, micro-batches of 1, 3 and B give bit-identical trajectories."""
    model = PerSample(TokenMLP(dtype=torch.float32))
    g = torch.Generator().manual_seed(0)
    cond, noise = torch.randn(B, 4, generator=g), torch.randn(B, *model.latent_shape, generator=g)
    out = split_rollouts(model, cond, noise, (None, 1, 3, B))
    for mb in (1, 3, B):
        for name in ("latents", "log_probs", "velocities"):
            assert torch.equal(getattr(out[mb], name), getattr(out[None], name)), (mb, name)
        assert torch.equal(out[mb].rng_after, out[None].rng_after)  # the generator consumed alike


def test_rollout_micro_batches_tiny_shapes():
    """The batched tiny-shapes model itself: its float32 kernels may round differently at another batch size
    (≈1e-6); the trajectories agree to that round-off and the generator is consumed alike."""
    model = build_backbone("tiny-shapes").eval()
    cond = model.encode_prompts(all_prompts()[:3])
    noise = torch.randn(3, *model.latent_shape, generator=torch.Generator().manual_seed(0))
    out = split_rollouts(model, cond, noise, (None, 1))
    torch.testing.assert_close(out[1].latents, out[None].latents, rtol=0, atol=1e-4)
    torch.testing.assert_close(out[1].log_probs, out[None].log_probs, rtol=0, atol=1e-4)
    assert torch.equal(out[1].rng_after, out[None].rng_after)
