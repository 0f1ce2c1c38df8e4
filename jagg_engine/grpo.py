"""GRPO advantages, the PPO-clipped per-step objective, the KL to a reference policy, and update metrics.

Pure torch. Notation:
    r_i          reward of sample i;   g(i) its prompt group (the G samples drawn for one prompt)
    A_i          advantage
    ρ_i          probability ratio π_θ(z_{j+1}|z_j) / π_old(z_{j+1}|z_j) = exp(log π_θ − log π_old)
    ε            PPO clip range
    μ, μ_ref     means of one SDE step's Gaussian under the policy and the reference policy; s its std
"""

from __future__ import annotations

from typing import NamedTuple

import torch

KL_FORMS = ("flow-grpo", "gaussian")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-4,
    global_std: bool = False,
    clip: float | None = 5.0,
) -> torch.Tensor:
    """GRPO advantages (DeepSeekMath GRPO; Flow-GRPO eq. 4), one value per sample.

        A_i = (r_i − mean_{g(i)} r) / (std + eps)

    where std is the std of the rewards in the sample's own group (``global_std=False``) or the std over the
    whole batch of the group-centred rewards r_i − mean_{g(i)} r (``global_std=True``, which keeps a group of
    near-ties from being blown up to ±1). Then clipped to [−clip, clip].

    Shapes: rewards (B,), group_ids (B,) integer labels → (B,).
    """
    rewards = rewards.to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) group index 0..G−1
    n_groups = int(inverse.max()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    means = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards) / counts  # (G,)
    centred = rewards - means[inverse]  # (B,)
    if global_std:
        std = centred.std(unbiased=False).expand_as(centred)
    else:
        var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2) / counts
        std = var.sqrt()[inverse]
    adv = centred / (std + eps)
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv.float()


class PPOStats(NamedTuple):
    loss: torch.Tensor  # scalar
    approx_kl: torch.Tensor  # scalar, ½·mean((log ρ)²)
    clipfrac: torch.Tensor  # scalar, fraction of samples with |ρ − 1| > ε
    ratio_mean: torch.Tensor  # scalar
    kl: torch.Tensor  # scalar, KL to the reference policy (0 without one)


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, PPOStats]:
    """PPO-clipped surrogate (Schulman et al. 2017, eq. 7), as a loss to minimise, averaged over the batch.

        L = mean_i max(−A_i·ρ_i, −A_i·clip(ρ_i, 1 − ε, 1 + ε))

    Shapes: log_prob, old_log_prob, advantages (B,) → scalar loss and PPOStats of detached scalars.
    """
    log_ratio = log_prob - old_log_prob.detach()
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(ratio.dtype)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = PPOStats(
            loss=loss.detach(),
            approx_kl=0.5 * (log_ratio.detach() ** 2).mean(),
            clipfrac=((ratio.detach() - 1.0).abs() > clip_range).to(ratio.dtype).mean(),
            ratio_mean=ratio.detach().mean(),
            kl=torch.zeros((), dtype=ratio.dtype, device=ratio.device),
        )
    return loss, stats


def gaussian_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std²) ‖ N(ref_mean, std²)) per sample, averaged over non-batch dims (Flow-GRPO's KL).

        KL = (mean − ref_mean)² / (2·std²)

    Shapes: mean, ref_mean (B, ...), std scalar → (B,).
    """
    return ((mean - ref_mean.detach()) ** 2 / (2 * std**2)).flatten(1).mean(dim=1)


def step_kl(
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    std: torch.Tensor,
    form: str = "flow-grpo",
    step_size: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """The KL term of one SDE step, per sample, in the form ``form``:

        gaussian   mean((μ − μ_ref)²) / (2·s²)           the closed-form KL of the step's two Gaussians
        flow-grpo  mean((μ − μ_ref)²) / (2·s²/h) = h × gaussian

    "flow-grpo" is what Flow-GRPO's training code computes (train_sd3.py: ``kl_loss = ((prev_sample_mean −
    prev_sample_mean_ref)²).mean() / (2·std_dev_t²)``): it divides by the squared noise scale g² = s²/h that
    its step returns, not by the step's variance s², so a β from a Flow-GRPO config means the same here.
    h is :meth:`jagg_engine.sde.SamplerConfig.kl_step_size`: σ_j − σ_{j+1} for the Euler–Maruyama samplers
    (flow-grpo, dance), so the Gaussian KL is 1/h = T times larger on a uniform T-step schedule; 1 for cps.

    Shapes: mean, ref_mean (B, ...), std and step_size scalars → (B,).
    """
    if form not in KL_FORMS:
        raise ValueError(f"kl_form: must be one of {', '.join(KL_FORMS)}, got {form!r}")
    kl = gaussian_kl(mean, ref_mean, std)
    return kl if form == "gaussian" else kl * step_size
