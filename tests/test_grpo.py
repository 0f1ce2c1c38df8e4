import math

import pytest
import torch

from jagg_engine.grpo import gaussian_kl, group_advantages, ppo_clip_loss, step_kl

REWARDS = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 6.0])
GROUPS = torch.tensor([0, 0, 1, 1, 2, 2])


def test_group_advantages_by_hand():
    # group means 2, 2, 3 → centred [−1, 1, 0, 0, −3, 3]; per-group std 1, 1, 0, 0, 3, 3
    adv = group_advantages(REWARDS, GROUPS, eps=1e-4, clip=None)
    expected = torch.tensor([-1 / 1.0001, 1 / 1.0001, 0.0, 0.0, -3 / 3.0001, 3 / 3.0001])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_global_std_and_clip():
    # std over the batch of the centred rewards: sqrt((1 + 1 + 0 + 0 + 9 + 9) / 6)
    std = math.sqrt(20 / 6)
    adv = group_advantages(REWARDS, GROUPS, eps=0.0, global_std=True, clip=None)
    torch.testing.assert_close(adv, torch.tensor([-1, 1, 0, 0, -3, 3]) / std)
    clipped = group_advantages(REWARDS, GROUPS, eps=0.0, global_std=True, clip=1.5)
    torch.testing.assert_close(clipped, torch.tensor([-1 / std, 1 / std, 0, 0, -1.5, 1.5]))


def test_group_advantages_any_label_order():
    adv = group_advantages(torch.tensor([5.0, 1.0, 7.0, 3.0]), torch.tensor([9, 4, 9, 4]), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, -1.0, 1.0, 1.0]))


def test_ppo_clip_loss_by_hand():
    # ratios 1, 1.5, 0.5; advantages 1, 1, −1; ε = 0.2
    # −A·ρ = [−1, −1.5, 0.5]; −A·clip(ρ) = [−1, −1.2, 0.8]; max → [−1, −1.2, 0.8], mean −1.4/3
    old = torch.zeros(3, dtype=torch.float64)
    logp = torch.log(torch.tensor([1.0, 1.5, 0.5], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    loss, stats = ppo_clip_loss(logp, old, adv, clip_range=0.2)
    assert loss.item() == pytest.approx(-1.4 / 3)
    assert stats.clipfrac.item() == pytest.approx(2 / 3)
    assert stats.ratio_mean.item() == pytest.approx(1.0)
    assert stats.approx_kl.item() == pytest.approx(0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 3)
    loss.backward()
    # d/dlogp: only the unclipped sample passes gradient: −A·ρ/3 = −1/3; the clipped ones give 0
    torch.testing.assert_close(logp.grad, torch.tensor([-1 / 3, 0.0, 0.0], dtype=torch.float64))


def test_gaussian_kl_by_hand():
    mean = torch.tensor([[1.0, 2.0]])
    ref = torch.tensor([[0.0, 0.0]])
    # ((1² + 2²)/2) / (2·0.5²) = 2.5 / 0.5 = 5
    assert gaussian_kl(mean, ref, torch.tensor(0.5)).item() == pytest.approx(5.0)


@pytest.mark.parametrize("form", ["flow-grpo", "gaussian"])
def test_step_kl_by_hand(form):
    mean = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    # Flow-GRPO step σ 0.75 → 0.5, η 0.7: g = std_dev_t = 0.7·sqrt(0.75/0.25) = 0.7·sqrt(3), step std s = g·sqrt(0.25)
    g = 0.7 * math.sqrt(3)
    s = g * 0.5
    sq = (1**2 + 2**2) / 2  # mean((μ − μ_ref)²) = 2.5
    # Flow-GRPO's train_sd3.py divides by 2·std_dev_t²; the closed-form Gaussian KL by 2·s² (= 2·g²·|Δσ|)
    expected = sq / (2 * g**2) if form == "flow-grpo" else sq / (2 * s**2)
    kl = step_kl(mean, ref, torch.tensor(s, dtype=torch.float64), form, step_size=0.25)
    assert kl.item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="^kl_form: must be one of flow-grpo, gaussian"):
        step_kl(mean, ref, torch.tensor(s), "closed")
