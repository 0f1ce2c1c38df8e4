import math

import pytest
import torch

from jagg_engine.grpo import ADV_STDS, gaussian_kl, group_advantages, ppo_clip_loss, step_kl

REWARDS = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0, 6.0])
GROUPS = torch.tensor([0, 0, 1, 1, 2, 2])


def test_group_advantages_by_hand():
    # group means 2, 2, 3 → centred [−1, 1, 0, 0, −3, 3]; per-group std 1, 1, 0, 0, 3, 3
    adv = group_advantages(REWARDS, GROUPS, eps=1e-4, clip=None)
    expected = torch.tensor([-1 / 1.0001, 1 / 1.0001, 0.0, 0.0, -3 / 3.0001, 3 / 3.0001])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_centered_std_and_clip():
    # std over the batch of the centred rewards: sqrt((1 + 1 + 0 + 0 + 9 + 9) / 6)
    std = math.sqrt(20 / 6)
    adv = group_advantages(REWARDS, GROUPS, eps=0.0, std="centered", clip=None)
    torch.testing.assert_close(adv, torch.tensor([-1, 1, 0, 0, -3, 3]) / std)
    clipped = group_advantages(REWARDS, GROUPS, eps=0.0, std="centered", clip=1.5)
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


# ---------------------------------------------------------------------- the peers' advantages, written out
# Rewards of 3 prompts × 4 samples, prompt groups not contiguous (as after a gather from several ranks).
PEER_REWARDS = [0.2, 0.9, 0.4, 0.4, 0.1, 0.8, 0.3, 0.35, 0.5, 0.6, 0.9, 0.0]
PEER_PROMPTS = ["a", "b", "c", "a", "b", "c", "a", "b", "c", "a", "b", "c"]


def flow_grpo_stat_tracker(prompts, rewards, global_std):
    """Flow-GRPO's PerPromptStatTracker.update (flow_grpo/stat_tracking.py) on one fresh tracker, written out:
    per prompt, mean of its rewards; std = np.std of the prompt's rewards, or of ALL the rewards with
    global_std; advantage (r − mean) / (std + 1e-4)."""
    import numpy as np

    prompts, rewards = np.array(prompts), np.array(rewards, dtype=np.float64)
    out = np.zeros_like(rewards)
    for prompt in np.unique(prompts):
        mine = rewards[prompts == prompt]
        std = np.std(rewards) if global_std else np.std(mine)
        out[prompts == prompt] = (mine - np.mean(mine)) / (std + 1e-4)
    return out


def dance_grpo_group_advantages(rewards, num_generations):
    """DanceGRPO's train_grpo_flux.py (use_group): contiguous groups of num_generations, torch's (unbiased)
    std + 1e-8."""
    rewards = torch.tensor(rewards, dtype=torch.float64)
    out = torch.zeros_like(rewards)
    for start in range(0, len(rewards), num_generations):
        group = rewards[start : start + num_generations]
        out[start : start + num_generations] = (group - group.mean()) / (group.std() + 1e-8)
    return out


@pytest.mark.parametrize(("std", "global_std"), [("group", False), ("global", True)])
def test_advantages_equal_flow_grpo_stat_tracker(std, global_std):
    groups = torch.tensor([ord(p) for p in PEER_PROMPTS])
    adv = group_advantages(torch.tensor(PEER_REWARDS), groups, std=std, clip=None)
    expected = torch.tensor(flow_grpo_stat_tracker(PEER_PROMPTS, PEER_REWARDS, global_std))
    torch.testing.assert_close(adv.double(), expected, rtol=1e-6, atol=1e-6)


def test_advantages_equal_dance_grpo():
    order = sorted(
        range(len(PEER_PROMPTS)), key=lambda i: PEER_PROMPTS[i]
    )  # DanceGRPO's groups are contiguous
    rewards = [PEER_REWARDS[i] for i in order]
    groups = torch.tensor([ord(PEER_PROMPTS[i]) for i in order])
    adv = group_advantages(torch.tensor(rewards), groups, std="group-unbiased", clip=None)
    torch.testing.assert_close(adv.double(), dance_grpo_group_advantages(rewards, 4), rtol=1e-6, atol=1e-6)


def test_the_four_stds_differ_and_clip_applies():
    groups = torch.tensor([ord(p) for p in PEER_PROMPTS])
    rewards = torch.tensor(PEER_REWARDS)
    forms = {s: group_advantages(rewards, groups, std=s, clip=None) for s in ADV_STDS}
    for a in ADV_STDS:
        for b in ADV_STDS:
            assert a == b or not torch.allclose(forms[a], forms[b])
    clipped = group_advantages(rewards, groups, std="group-unbiased", clip=0.5)
    torch.testing.assert_close(clipped, forms["group-unbiased"].clamp(-0.5, 0.5))
    with pytest.raises(ValueError, match="adv_std: must be one of group, global, centered, group-unbiased"):
        group_advantages(rewards, groups, std="batch")


def test_config_lists_the_engines_advantage_stds():
    from jagg_engine.train import config

    assert config.ADV_STDS == ADV_STDS
