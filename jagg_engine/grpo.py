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


ADV_STDS = ("group", "global", "centered", "group-unbiased")
# The ε of each form: the reference code's (Flow-GRPO's stat tracker adds 1e-4, DanceGRPO 1e-8).
ADV_EPS = {"group": 1e-4, "global": 1e-4, "centered": 1e-4, "group-unbiased": 1e-8}


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float | None = None,
    std: str = "group",
    clip: float | None = 5.0,
) -> torch.Tensor:
    """GRPO advantages (DeepSeekMath GRPO; Flow-GRPO eq. 4), one value per sample.

        A_i = (r_i − mean_{g(i)} r) / (S_i + eps)

    with S_i chosen by ``std`` (n the number of samples it is taken over, population std unless said):

        group           std of the rewards of the sample's own group        Flow-GRPO, ``global_std=False``
        global          std of the raw rewards r over the whole batch         Flow-GRPO, ``global_std=True``
        centered        std over the whole batch of r_i − mean_{g(i)} r       (a group of near-ties stays small)
        group-unbiased  unbiased std (n − 1) of the sample's own group      DanceGRPO (``use_group``)

    (Flow-GRPO: ``flow_grpo/stat_tracking.py`` PerPromptStatTracker, np.std + 1e-4 on the rewards gathered
    from every process; DanceGRPO: ``train_grpo_flux.py``, torch ``std()`` + 1e-8 per group.) ``eps`` None is
    the reference code's (:data:`ADV_EPS`). Then clipped to [−clip, clip], as both codes clip in the loss.

    Shapes: rewards (B,), group_ids (B,) integer labels → (B,).
    """
    if std not in ADV_STDS:
        raise ValueError(f"adv_std: must be one of {', '.join(ADV_STDS)}, got {std!r}")
    eps = ADV_EPS[std] if eps is None else eps
    rewards = rewards.to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) group index 0..G−1
    n_groups = int(inverse.max()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    means = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards) / counts  # (G,)
    centred = rewards - means[inverse]  # (B,)
    if std == "global":
        scale = rewards.std(unbiased=False).expand_as(centred)
    elif std == "centered":
        scale = centred.std(unbiased=False).expand_as(centred)
    else:
        denom = counts if std == "group" else (counts - 1).clamp(min=1)
        var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2) / denom
        scale = var.sqrt()[inverse]
    adv = centred / (scale + eps)
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
