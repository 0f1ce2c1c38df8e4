"""The velocity-reuse guard reads PyTorch's own state: whatever changed the policy since the rollout — a weight
load, a bare optimizer step, another model object, a dropout (module or functional) — the update reuses
nothing and its gradient is the one without reuse."""

import copy

import pytest
import torch
import torch.nn.functional as F

from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, forward_draws_random, rollout

F64 = torch.float64
SAMPLER = SamplerConfig(num_steps=9, sde_window=(0, 8))  # groups 4, 4: 2 × 2 inner steps
INNER = 4


class Net(torch.nn.Module):
    """A small nonlinear velocity field over (B, N, C) tokens; ``dropout`` = "module", "functional" (follows
    the train flag), "always" (F.dropout with its default training=True) or None."""

    def __init__(self, dropout=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.latent_shape = (6, 8)
        self.inp = torch.nn.Linear(9, 32, dtype=F64)
        self.out = torch.nn.Linear(32, 8, dtype=F64)
        self.kind = dropout
        self.drop = torch.nn.Dropout(0.2) if dropout == "module" else torch.nn.Identity()

    def forward(self, z, t, cond=None):
        h = torch.tanh(self.inp(torch.cat([z, t[:, None, None].expand(-1, z.shape[1], 1)], -1)))
        if self.kind == "functional":
            h = F.dropout(h, 0.2, training=self.training)
        elif self.kind == "always":
            h = F.dropout(h, 0.2)
        return self.out(self.drop(h))

    def trainable_parameters(self):
        return list(self.parameters())


def sample(model, batch=4):
    g = torch.Generator().manual_seed(0)
    traj = rollout(
        model,
        None,
        torch.randn(batch, *model.latent_shape, generator=g, dtype=F64),
        SAMPLER,
        g,
        store_velocities=True,
    )
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g, dtype=F64)
    return traj, torch.randn(batch, generator=g, dtype=F64)


def update(model, traj, adv, reuse):
    params = model.trainable_parameters()
    for p in params:
        p.grad = None
    torch.manual_seed(123)  # the same dropout masks with and without reuse
    config = UpdateConfig(window=4, clip_range=1e-2, reuse_rollout_velocity=reuse)
    result = policy_update(model, traj, adv, config, SAMPLER)
    return result, torch.cat([p.grad.flatten() for p in params])


def assert_no_reuse_same_gradient(model, traj, adv):
    auto, g_auto = update(model, traj, adv, "auto")
    off, g_off = update(model, traj, adv, "off")
    assert auto.counts.reused == 0 and auto.counts.forward_nograd == off.counts.forward_nograd == INNER
    assert torch.equal(g_auto, g_off)


def test_unchanged_policy_reuses_and_equals_the_forwards():
    model = Net().eval()
    traj, adv = sample(model)
    auto, g_auto = update(model, traj, adv, "auto")
    off, g_off = update(model, traj, adv, "off")
    assert auto.counts.reused == INNER and auto.counts.forward_nograd == 0
    assert ((g_auto - g_off).norm() / g_off.norm()).item() <= 1e-12


def test_load_state_dict_stops_reuse():
    model = Net().eval()
    traj, adv = sample(model)
    other = Net(seed=1).state_dict()
    model.load_state_dict(other)
    assert_no_reuse_same_gradient(model, traj, adv)
    # the stale velocities would have been wrong: another model's velocities differ
    with torch.no_grad():
        assert not torch.allclose(model(traj.latents[1], traj.sigmas[1].expand(4)), traj.velocities[1])


def test_load_state_dict_of_the_same_values_stops_reuse():
    """No value comparison: any in-place write counts, even one that leaves the weights as they were."""
    model = Net().eval()
    traj, adv = sample(model)
    model.load_state_dict(copy.deepcopy(model.state_dict()))
    assert_no_reuse_same_gradient(model, traj, adv)


def test_bare_optimizer_step_stops_reuse():
    model = Net().eval()
    traj, adv = sample(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    update(model, traj, adv, "off")  # some gradient
    optimizer.step()  # no call to tell anyone
    assert_no_reuse_same_gradient(model, traj, adv)


def test_another_model_object_stops_reuse():
    model = Net().eval()
    traj, adv = sample(model)
    twin = copy.deepcopy(model)  # the same weights, another object
    assert_no_reuse_same_gradient(twin, traj, adv)


@pytest.mark.parametrize("kind", ["functional", "module"])
def test_dropout_in_train_mode_at_update_stops_reuse(kind):
    model = Net(dropout=kind).eval()
    traj, adv = sample(model)  # sampled in eval mode: no dropout
    model.train()  # the update's forwards now drop units
    assert_no_reuse_same_gradient(model, traj, adv)
    model.eval()
    assert update(model, traj, adv, "auto")[0].counts.reused == INNER


def test_dropout_while_sampling_stops_reuse():
    """F.dropout with its default training=True is active even in eval mode: the stored velocities are draws."""
    model = Net(dropout="always").eval()
    traj, adv = sample(model)
    assert traj.policy is not None and traj.policy.random
    assert_no_reuse_same_gradient(model, traj, adv)


def test_random_op_watch():
    x = torch.randn(2, 3, 4, 8)
    cases = {
        lambda z: F.dropout(z, 0.1): True,
        lambda z: F.dropout(z, 0.1, training=False): False,
        lambda z: F.dropout(z, 0.0): False,
        lambda z: F.scaled_dot_product_attention(
            z, z, z
        ): False,  # the kernel is tagged seeded; dropout_p = 0
        lambda z: F.scaled_dot_product_attention(z, z, z, dropout_p=0.1): True,
        lambda z: z * torch.rand_like(z): True,
        lambda z: z.relu(): False,
    }
    for fn, expected in cases.items():
        assert forward_draws_random(lambda z, t, c, fn=fn: fn(z), x, torch.zeros(2), None) is expected
    state = torch.get_rng_state()
    forward_draws_random(lambda z, t, c: F.dropout(z, 0.5), x, torch.zeros(2), None)
    assert torch.equal(torch.get_rng_state(), state)  # the check draws nothing from the caller's RNG
