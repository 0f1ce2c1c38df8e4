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
    return result, torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in params])


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


# ---------------------------------------------------------------------- writes the version counters miss
# Each write below leaves every parameter's ``_version`` where it was (asserted where that is the point), so a
# guard of version counters alone would reuse stale velocities; the value fingerprint and the settings see
# them: 0 velocities reused, and the gradient bit-equal to the one without reuse.


def versions(model):
    return [p._version for p in model.parameters()]


def assert_stale(model, traj):
    """The stored velocities are no longer the policy's: reusing them would have been wrong."""
    with torch.no_grad():
        now = model(traj.latents[1], traj.sigmas[1].expand(traj.batch_size))
    assert not torch.equal(now, traj.velocities[1])


def test_data_write_stops_reuse():
    model = Net().eval()
    traj, adv = sample(model)
    before = versions(model)
    model.inp.weight.data.mul_(1 + 1e-3)  # .data: a view with its own version counter
    model.out.bias.data = model.out.bias.data + 1e-3  # a new storage behind the same Parameter
    assert versions(model) == before
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)


def test_vector_to_parameters_stops_reuse():
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    model = Net().eval()
    traj, adv = sample(model)
    before = versions(model)
    vector_to_parameters(parameters_to_vector(model.parameters()) * (1 + 1e-3), model.parameters())
    assert versions(model) == before
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)


def test_fused_adamw_step_stops_reuse():
    model = Net().eval()
    traj, adv = sample(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    update(model, traj, adv, "off")  # some gradient
    before = versions(model)
    optimizer.step()
    assert versions(model) == before  # the fused kernel writes without bumping the counters
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)


class Gain(Net):
    """Net with a plain float setting read by the forward (as a guidance scale is)."""

    def __init__(self):
        super().__init__()
        self.gain = 1.0

    def forward(self, z, t, cond=None):
        return self.gain * super().forward(z, t, cond)


def test_scalar_attribute_change_stops_reuse():
    model = Gain().eval()
    traj, adv = sample(model)
    model.gain = 1.5
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)
    model.gain = 1.0  # back to the sampling setting: the policy is the sampling one again
    assert update(model, traj, adv, "auto")[0].counts.reused == INNER


class Normed(Net):
    """Net with a BatchNorm: train mode normalises by the batch, eval mode by the running statistics."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(6, dtype=F64)

    def forward(self, z, t, cond=None):
        return super().forward(self.norm(z), t, cond)


def test_module_mode_change_stops_reuse():
    model = Normed().eval()
    traj, adv = sample(model)
    model.norm.train()
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)


def lora_net():
    from peft import LoraConfig, inject_adapter_in_model

    model = inject_adapter_in_model(LoraConfig(r=2, lora_alpha=2, target_modules=["inp"]), Net())
    torch.manual_seed(5)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn_like(p).to(F64)  # a trained adapter (B = 0 at init changes nothing)
        elif "lora_" in name:
            p.data = p.data.to(F64)
        p.requires_grad_(True)  # the base weights train too: the gradient exists with the adapter off
    return model.eval()


def lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def test_lora_adapter_toggled_stops_reuse():
    model = lora_net()
    traj, adv = sample(model)
    for layer in lora_layers(model):
        layer.enable_adapters(False)
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)
    for layer in lora_layers(model):
        layer.enable_adapters(True)
    assert update(model, traj, adv, "auto")[0].counts.reused == INNER


def test_lora_adapter_rescaled_stops_reuse():
    model = lora_net()
    traj, adv = sample(model)
    for layer in lora_layers(model):
        layer.scale_layer(2.0)
    assert_stale(model, traj)
    assert_no_reuse_same_gradient(model, traj, adv)


def test_caller_that_wrote_the_policy_forbids_reuse_whatever_the_guard_says(monkeypatch):
    """rollout_policy=False: no reuse even where the guard would allow it (the trainer's first check)."""
    model = Net().eval()
    traj, adv = sample(model)
    config = UpdateConfig(window=4, clip_range=1e-2, reuse_rollout_velocity="auto")
    result = policy_update(model, traj, adv, config, SAMPLER, rollout_policy=False)
    assert result.counts.reused == 0 and result.counts.forward_nograd == INNER


def test_fingerprint_sees_any_single_bit():
    from jagg_engine.sde import tensor_fingerprints

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(1000, dtype=dtype)
        h = tensor_fingerprints((x,))
        y = x.clone()
        y.view(
            torch.int16 if dtype == torch.bfloat16 else torch.int32 if dtype == torch.float32 else torch.int64
        )[517] ^= 1  # the lowest bit of one element
        assert not torch.equal(tensor_fingerprints((y,)), h)
        assert not torch.equal(tensor_fingerprints((x.roll(1),)), h)  # the positions count
        assert torch.equal(tensor_fingerprints((x.clone(),)), h)


@pytest.mark.gpu
def test_fingerprints_of_a_model_on_two_devices():
    """FLUX keeps position ids on the CPU beside weights on the GPU: one fingerprint vector, on the CPU."""
    from jagg_engine.sde import tensor_fingerprints

    on_cpu, on_gpu = torch.randn(10), torch.randn(10, device="cuda")
    both = tensor_fingerprints((on_cpu, on_gpu))
    assert both.device.type == "cpu"
    assert torch.equal(both, torch.cat([tensor_fingerprints((on_cpu,)), tensor_fingerprints((on_gpu,))]))
