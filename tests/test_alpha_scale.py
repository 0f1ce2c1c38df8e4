"""alpha_scale: JAGG's inner weights at the far endpoint scaled (α_j ← c·α_j), against plain autograd, where it is
exact, and through the real Trainer in the combinations users make."""

import pytest
import torch
from test_control_variate_trainer import COMBOS as TRAINER_COMBOS
from test_control_variate_trainer import gradients_of_steps, make_trainer
from test_jagg import F64, flat_grad, flux64_rollout, jagg_by_definition, rel_err, sde_rollout, zero

from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.cost import make_groups
from jagg_engine.credit import jagg_alpha
from jagg_engine.jagg import UpdateConfig, policy_update, run_single_group
from jagg_engine.sde import SamplerConfig
from jagg_engine.train.config import ConfigError, load_config


def test_jagg_alpha_scales_the_inner_weights_only():
    t = torch.tensor([1.0, 0.9, 0.7, 0.4], dtype=F64)
    torch.testing.assert_close(jagg_alpha(t), torch.tensor([0.0, 1 / 6, 0.5, 1.0], dtype=F64))
    torch.testing.assert_close(jagg_alpha(t, 0.5), torch.tensor([0.0, 1 / 12, 0.25, 1.0], dtype=F64))
    torch.testing.assert_close(jagg_alpha(t, 0.0), torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64))


@pytest.fixture(scope="module")
def tiny_flux64():
    return flux64_rollout(["a red circle", "a blue square", "a cat", "a dog"])


@pytest.mark.parametrize("scale", [0.0, 0.5])
@pytest.mark.parametrize("extra", [{}, {"micro_batch": 3}, {"endpoint_backward": "sequential"}])
def test_alpha_scale_equals_its_definition_by_plain_autograd(tiny_flux64, scale, extra):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    surrogate = sum(
        jagg_by_definition(model, traj, adv, sampler, 1e-2, steps, alpha_scale=scale)
        for steps in make_groups(traj.sde_steps, 4)
    )
    zero(params)
    surrogate.backward()
    expected = flat_grad(params)
    zero(params)
    update = UpdateConfig(strategy="jagg", window=4, clip_range=1e-2, alpha_scale=scale, **extra)
    policy_update(model, traj, adv, update, sampler)
    assert rel_err(flat_grad(params), expected) <= 1e-10
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(strategy="jagg", window=4, clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected) > 1e-3  # another gradient than the paper's α


def group_gradients(model, traj, adv, sampler, steps, scale):
    params = model.trainable_parameters()
    out = {}
    for kind in ("exact", "jagg"):
        zero(params)
        update = UpdateConfig(window=len(steps), clip_range=0.05, alpha_scale=scale)
        run_single_group(model, traj, adv, update, sampler, steps, kind)
        out[kind] = flat_grad(params)
    return out


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
def test_alpha_scale_zero_is_exact_where_the_jacobian_is_constant(kind):
    """v = A·z + θ_0 (θ_1 frozen): ∂v/∂θ = I at every z and t, so any α is exact; with θ_1 trained ∂v/∂θ is
    affine in t and only the paper's α (c = 1) stays exact (Theorem 1)."""
    sampler = SamplerConfig(kind=kind, num_steps=9, eta=0.7)
    model = LinearToy()
    traj, adv = sde_rollout(model, sampler)
    steps = traj.sde_steps[:4]
    g = group_gradients(model, traj, adv, sampler, steps, 0.0)
    assert rel_err(g["jagg"], g["exact"]) > 1e-3  # θ_1's Jacobian t·I: the near endpoint is off
    g = group_gradients(model, traj, adv, sampler, steps, 1.0)
    assert rel_err(g["jagg"], g["exact"]) <= 1e-9
    model.theta1.requires_grad_(False)
    g = group_gradients(model, traj, adv, sampler, steps, 0.0)
    assert g["exact"].norm() > 0
    assert rel_err(g["jagg"], g["exact"]) <= 1e-9


COMBOS, IDS = list(TRAINER_COMBOS.values()), list(TRAINER_COMBOS)


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_the_trainer_s_gradient_is_affine_in_alpha_scale(tmp_path, combo):
    """s_base and s_corr are affine in c, so is JAGG's gradient: the trainer's first step at c = 0.5 is the mean
    of its steps at 0 and 1 (the same rollout), and c = 0 is another gradient than c = 1."""
    grads = {
        c: gradients_of_steps(
            make_trainer(tmp_path, f"c{c}", "strategy=jagg", f"alpha_scale={c}", *combo), [1]
        )[0]
        for c in (0.0, 0.5, 1.0)
    }
    mean = (grads[0.0] + grads[1.0]) / 2
    assert float((grads[0.5] - mean).norm() / mean.norm()) <= 1e-5  # float32
    assert float((grads[0.0] - grads[1.0]).norm() / grads[1.0].norm()) > 1e-3


@pytest.mark.parametrize("combo", COMBOS[:2], ids=IDS[:2])
def test_the_control_variate_corrects_any_alpha_scale_to_exact(tmp_path, combo):
    exact = gradients_of_steps(make_trainer(tmp_path, "exact", "strategy=exact", *combo), [1])
    near = gradients_of_steps(make_trainer(tmp_path, "near", "alpha_scale=0", "cv_frac=1.0", *combo), [1])
    for a, b in zip(near, exact):
        assert float((a - b).norm() / b.norm()) <= 1e-5


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["alpha_scale=1.5"], "alpha_scale: must be"),
        (["alpha_scale=-0.1"], "alpha_scale: must be"),
        (["strategy=exact", "alpha_scale=0"], "alpha_scale: weighs JAGG's endpoints; needs strategy jagg"),
    ],
)
def test_alpha_scale_refusals_name_the_field(overrides, line):
    with pytest.raises(ConfigError, match=f"^{line}"):
        load_config(None, overrides)
