"""far_credit=cross: JAGG's inner far credits at the far endpoint of the next sample of the same group (cross-
fitting), against plain autograd, where it is exact, and through the real Trainer in the combinations users make."""

import pytest
import torch
from test_control_variate_trainer import COMBOS as TRAINER_COMBOS
from test_control_variate_trainer import gradients_of_steps, make_trainer
from test_jagg import F64, flat_grad, flux64_rollout, rel_err, sde_rollout, velocities_and_upstreams, zero

from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.cost import make_groups
from jagg_engine.credit import far_upstream, group_shift, interpolation_weights
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig
from jagg_engine.train.config import ConfigError, load_config


def test_group_shift_moves_each_row_to_the_next_sample_of_its_group():
    s = torch.arange(6.0)[:, None]  # samples 0..5, groups {0, 1, 2} and {3, 4, 5}
    # row i of the result is the credit of the previous sample of i's group: sample i's credit lands on i + 1
    assert group_shift(s, 3).flatten().tolist() == [2.0, 0.0, 1.0, 5.0, 3.0, 4.0]
    assert group_shift(s, 2).flatten().tolist() == [1.0, 0.0, 3.0, 2.0, 5.0, 4.0]
    with pytest.raises(ValueError, match="^far_credit: cross needs groups"):
        group_shift(s, 4)


def test_far_upstream_by_hand():
    s = torch.tensor([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]])[:, :, None]  # (W=3, B=2, 1), one group of 2
    alpha = torch.tensor([0.0, 0.25, 1.0])
    assert far_upstream(s, alpha).flatten().tolist() == [0.25 * 2 + 4, 0.25 * 20 + 40]
    # the inner credit crosses over: sample 0's far endpoint gets sample 1's, and the reverse
    assert far_upstream(s, alpha, 2).flatten().tolist() == [0.25 * 20 + 4, 0.25 * 2 + 40]


def cross_by_definition(model, traj, adv, sampler, clip_range, steps, group):
    """The cross-fitted surrogate of one group written out with plain autograd and explicit indices:
    Σ_i v̂_0^iᵀ s_base^i + v̂_{W−1}^iᵀ (s_{W−1}^i + Σ_inner α_j s_j^{prev(i)}), prev(i) the previous sample of i's
    group (cyclic), every s_j = ∂L/∂v̂_j on the group's full graph."""
    vs, s = velocities_and_upstreams(model, traj, adv, sampler, clip_range, steps)
    alpha = interpolation_weights(traj.sigmas[steps])
    surrogate = 0
    for i in range(traj.batch_size):
        prev = (i // group) * group + (i - 1) % group
        s_base = sum((1 - a) * s_j[i] for a, s_j in zip(alpha, s))
        s_far = s[-1][i] + sum(a * s_j[prev] for a, s_j in zip(alpha[1:-1], s[1:-1]))
        surrogate = surrogate + (vs[0][i] * s_base).sum() + (vs[-1][i] * s_far).sum()
    return surrogate


@pytest.fixture(scope="module")
def tiny_flux64():
    return flux64_rollout(["a red circle", "a red circle", "a blue square", "a blue square"])  # groups of 2


@pytest.mark.parametrize("extra", [{}, {"micro_batch": 2}, {"endpoint_backward": "sequential"}])
def test_cross_equals_its_definition_by_plain_autograd(tiny_flux64, extra):
    model, traj, adv, sampler = tiny_flux64
    params = model.trainable_parameters()
    surrogate = sum(
        cross_by_definition(model, traj, adv, sampler, 1e-2, steps, 2)
        for steps in make_groups(traj.sde_steps, 4)
    )
    zero(params)
    surrogate.backward()
    expected = flat_grad(params)
    zero(params)
    update = UpdateConfig(window=4, clip_range=1e-2, far_credit="cross", group_size=2, **extra)
    policy_update(model, traj, adv, update, sampler)
    assert rel_err(flat_grad(params), expected) <= 1e-10
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(window=4, clip_range=1e-2), sampler)
    assert rel_err(flat_grad(params), expected) > 1e-3  # another gradient than the paper's own far credit


def gradients(model, traj, adv, sampler, **update):
    params = model.trainable_parameters()
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(window=4, clip_range=0.05, **update), sampler)
    return flat_grad(params)


def test_cross_equals_own_where_the_group_shares_its_states(tiny_flux64):
    """Where every sample of a group has the same trajectory the far states are the same, so moving a credit to
    another sample's far endpoint changes nothing (advantages still differ, so the credits do)."""
    model, traj, _, sampler = tiny_flux64
    twins = traj.select(torch.tensor([0, 0, 2, 2]))
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=F64)
    own = gradients(model, twins, adv, sampler)
    cross = gradients(model, twins, adv, sampler, far_credit="cross", group_size=2)
    assert own.norm() > 0
    assert rel_err(cross, own) <= 1e-8  # float64 sums over the batch in another order, with cancellation


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
def test_cross_is_exact_under_theorem_1s_condition(kind):
    """v = A·z + θ_0 + t·θ_1 with A frozen: ∂v/∂θ = (I, t·I) is affine in t and does not depend on z, so JAGG is
    exact (Theorem 1) and so is the cross-fitted credit, whose far state is another sample's; with A trained the
    Jacobian depends on z and cross moves away from exact."""
    sampler = SamplerConfig(kind=kind, num_steps=9, eta=0.7)
    model = LinearToy()
    traj, adv = sde_rollout(model, sampler)
    exact = gradients(model, traj, adv, sampler, strategy="exact")
    cross = gradients(model, traj, adv, sampler, far_credit="cross", group_size=2)
    assert exact.norm() > 0
    assert rel_err(cross, exact) <= 1e-9
    model = LinearToy(train_a=True)
    traj, adv = sde_rollout(model, sampler)
    exact = gradients(model, traj, adv, sampler, strategy="exact")
    cross = gradients(model, traj, adv, sampler, far_credit="cross", group_size=2)
    assert rel_err(cross, exact) > 1e-4


@pytest.mark.parametrize(
    "update, line",
    [
        ({"far_credit": "other"}, "far_credit: must be one of own, cross"),
        ({"far_credit": "cross"}, "far_credit: cross needs group_size >= 2"),
        ({"far_credit": "cross", "group_size": 4, "cv_frac": 0.5}, "far_credit: cross is a JAGG estimator"),
        ({"far_credit": "cross", "group_size": 4, "micro_batch": 6}, "far_credit: cross needs whole groups"),
    ],
)
def test_update_config_refusals(update, line):
    with pytest.raises(ValueError, match=f"^{line}"):
        UpdateConfig(**update)


# the trainer combinations, with whole groups of 3 in each micro-batch and no mini-batches (they split groups)
CROSS_COMBOS = {**TRAINER_COMBOS, "micro-mini-batches": ["train_micro_batch=3"]}
COMBOS, IDS = list(CROSS_COMBOS.values()), [k.replace("micro-mini", "micro") for k in CROSS_COMBOS]


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_the_trainer_trains_with_the_cross_fitted_gradient(tmp_path, combo):
    """The real Trainer (groups of 3, two steps) through sliding windows, shared noise, every SDE kind: the
    cross-fitted gradient is another than own's on the same rollout, and the same whether the batch is one
    micro-batch or one group at a time (float32)."""
    cross = gradients_of_steps(make_trainer(tmp_path, "cross", "far_credit=cross", *combo), [1, 2])
    own = gradients_of_steps(make_trainer(tmp_path, "own", *combo), [1, 2])
    assert float((cross[0] - own[0]).norm() / own[0].norm()) > 1e-3
    assert all(torch.isfinite(g).all() and g.norm() > 0 for g in cross)
    if "train_micro_batch=3" not in combo:
        grouped = gradients_of_steps(
            make_trainer(tmp_path, "cross-mb", "far_credit=cross", "train_micro_batch=3", *combo), [1, 2]
        )
        for a, b in zip(grouped, cross):
            assert float((a - b).norm() / b.norm()) <= 1e-5


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["far_credit=sideways"], "far_credit: must be one of"),
        (["strategy=exact", "far_credit=cross"], "far_credit: cross needs .* got strategy 'exact'"),
        (["far_credit=cross", "cv_frac=0.5"], "far_credit: cross needs .* got cv_frac 0.5"),
        (
            ["far_credit=cross", "updates_per_rollout=2"],
            "far_credit: cross needs .* got updates_per_rollout 2",
        ),
        (["far_credit=cross", "train_micro_batch=4"], "far_credit: cross needs .* got train_micro_batch 4"),
    ],
)
def test_config_refusals_name_the_field(overrides, why):
    with pytest.raises(ConfigError, match=f"^{why}"):
        load_config(None, overrides)
