"""Flow-matching schedules, SDE sampling steps with log-probabilities, and the rollout.

Notation (flow matching, rectified flow):
    σ ∈ [0, 1]        flow time; z_σ = (1 − σ)·x0 + σ·ε, so σ = 1 is pure noise and σ = 0 the image
    v̂ = v_θ(z, σ)     the model's velocity prediction of ε − x0
    j = 0 … T−1       denoising step index; step j takes z_j at σ_j to z_{j+1} at σ_{j+1} < σ_j
    π_θ(z_{j+1}|z_j)  the Gaussian policy of one SDE step: N(μ_θ(z_j, v̂_j), std_j²·I)

Each SDE step is a pure function of (v̂, z, σ, σ_next, η) and, optionally, the stored next sample
``prev_sample`` (the name diffusers and ddpo-pytorch use), so the old log-prob of a stored z_{j+1} is
recomputed exactly. All step arithmetic runs in float32 at least (float64 stays float64), whatever the
model's dtype. Log-probs are averaged over the non-batch dimensions, as Flow-GRPO and DanceGRPO do.

Log-prob forms. The flow-grpo and dance steps use the full Gaussian log-density, as both reference codes do
(their constants cancel in the PPO ratio). For CPS, ``cps_log_prob`` chooses between
    "flow-grpo"  −mean((z' − μ)²): Flow-GRPO's CPS code (``sd3_sde_with_logprob``, sde_type "cps") drops the
                 constants AND the 1/(2·std²) factor, so log ρ is 2·std² times the Gaussian one and a clip range
                 means what it means in Flow-GRPO's CPS configs (the default)
    "gaussian"   log N(z'; μ, std²·I), averaged over the non-batch dims
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .backbones.base import Cond, VelocityFn, index_cond
from .ode import (  # noqa: F401  (the sampler's names for them)
    ODE_SEGMENTS,
    ODE_SOLVERS,
    DPMSolverSegment,
    EulerSegment,
    SamplingGrid,
    _as,
    _in_compute_dtype,
    compute_dtype,
    dpm_solver_config,
    ode_segment,
    ode_step,
    respace,
    set_flow_sigmas,
    shift_sigmas,
    unshift_sigmas,
)
from .policy_guard import (  # noqa: F401  (the rollout's names for them)
    PolicyState,
    forward_draws_random,
    policy_state,
    same_policy,
    scalar_settings,
    tensor_fingerprints,
)
from .sde_kinds import SDE_KINDS, SDEKind, get_sde, register_sde  # noqa: F401  (the registry, re-exported)

CPS_LOG_PROBS = ("flow-grpo", "gaussian")


def make_sigmas(num_steps: int, shift: float = 1.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Uniform σ from 1 to 0 in ``num_steps`` steps, then shifted. Shape (T + 1,), σ_0 = 1, σ_T = 0."""
    if num_steps < 1:
        raise ValueError(f"num_steps: must be a positive integer, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift: must be > 0, got {shift}")
    sigmas = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift_sigmas(sigmas, shift).to(dtype)


def explicit_sigmas(
    schedule: tuple[float, ...] | list[float] | torch.Tensor,
    num_steps: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """A given σ grid (a diffusers pipeline's, :meth:`DiffusersBackbone.pipeline_sigmas`) checked: T + 1 values,
    strictly decreasing, in [0, 1], the last one 0 (the image). Shape (T + 1,)."""
    sigmas = torch.as_tensor(schedule, dtype=torch.float64).reshape(-1)
    if sigmas.numel() != num_steps + 1:
        raise ValueError(f"schedule: must hold num_steps + 1 = {num_steps + 1} sigmas, got {sigmas.numel()}")
    if not (sigmas[1:] < sigmas[:-1]).all() or sigmas[0] > 1 or sigmas[-1] != 0:
        raise ValueError("schedule: sigmas must decrease strictly from at most 1 to 0")
    return sigmas.to(dtype)


class StepOutput(NamedTuple):
    prev_sample: torch.Tensor  # z_{j+1}, (B, ...)
    log_prob: torch.Tensor  # log π(z_{j+1} | z_j) averaged over non-batch dims, (B,)
    mean: torch.Tensor  # μ, (B, ...)
    std: torch.Tensor  # std of the step's Gaussian, scalar tensor


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std²) per element, averaged over all non-batch dims. (B, ...) → (B,).

    ``x`` is detached: the policy gradient flows only through the mean (Flow-GRPO, DanceGRPO).
    """
    logp = -((x.detach() - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return logp.flatten(1).mean(dim=1)


def squared_error_log_prob(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """−(x − mean)² per element, averaged over all non-batch dims. (B, ...) → (B,).

    The CPS log-prob of Flow-GRPO's code ("remove all constants"): the Gaussian log-density without its
    constants and without the 1/(2·std²) factor. ``x`` is detached, as in :func:`gaussian_log_prob`.
    """
    return (-((x.detach() - mean) ** 2)).flatten(1).mean(dim=1)


def _finish(
    mean: torch.Tensor,
    std: torch.Tensor,
    prev_sample: torch.Tensor | None,
    noise: torch.Tensor | None,
    generator: torch.Generator | None,
    log_prob_form: str = "gaussian",
) -> StepOutput:
    if prev_sample is None:
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        prev_sample = mean + std * noise.to(mean.dtype)
    prev_sample = prev_sample.to(mean.dtype)
    if log_prob_form == "gaussian":
        log_prob = gaussian_log_prob(prev_sample, mean, std)
    else:
        log_prob = squared_error_log_prob(prev_sample, mean)
    return StepOutput(prev_sample, log_prob, mean, std)


def flow_grpo_step(
    v: torch.Tensor,
    z: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    eta: float,
    sigma_max: float | torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """Flow-GRPO "sde" step (Liu et al. 2025, eq. 9–10; reverse SDE of rectified flow).

        std_t = η·sqrt(σ / (1 − σ))          (σ = 1 replaced by ``sigma_max`` in the denominator)
        dt    = σ_next − σ  (< 0)
        μ     = z·(1 + std_t²/(2σ)·dt) + v̂·(1 + std_t²·(1 − σ)/(2σ))·dt
        z'    ~ N(μ, (std_t·sqrt(−dt))²)

    Shapes: v, z (B, ...) → StepOutput with log_prob (B,).
    """
    v, z, sigma, sigma_next = _in_compute_dtype(v, z, sigma, sigma_next)
    denom_sigma = sigma if sigma_max is None or float(sigma) < 1.0 else _as(sigma_max, z)
    std_t = eta * torch.sqrt(sigma / (1 - denom_sigma))
    dt = sigma_next - sigma
    mean = z * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return _finish(mean, std_t * torch.sqrt(-dt), prev_sample, noise, generator)


def dance_step(
    v: torch.Tensor,
    z: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    eta: float,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """DanceGRPO step (Xue et al. 2025, the flow SDE of their `flux_step`).

        Δσ     = σ − σ_next  (> 0)
        x̂0     = z − σ·v̂
        score  = −(z − (1 − σ)·x̂0) / σ²
        μ      = z − Δσ·v̂ + (η²/2)·score·Δσ
        std    = η·sqrt(Δσ)

    Shapes: v, z (B, ...) → StepOutput with log_prob (B,).
    """
    v, z, sigma, sigma_next = _in_compute_dtype(v, z, sigma, sigma_next)
    dsigma = sigma - sigma_next
    x0 = z - sigma * v
    score = -(z - (1 - sigma) * x0) / sigma**2
    mean = z - dsigma * v + 0.5 * eta**2 * score * dsigma
    return _finish(mean, eta * torch.sqrt(dsigma), prev_sample, noise, generator)


def cps_step(
    v: torch.Tensor,
    z: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    eta: float,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    log_prob_form: str = "flow-grpo",
) -> StepOutput:
    """Coefficients-preserving sampling (Flow-CPS, Wang & Yu 2025): the step keeps z' on the σ_next marginal.

        std  = σ_next·sin(η·π/2)
        x̂0   = z − σ·v̂          ε̂ = z + (1 − σ)·v̂
        μ    = (1 − σ_next)·x̂0 + sqrt(σ_next² − std²)·ε̂

        log π = −mean((z' − μ)²)                                  log_prob_form "flow-grpo" (Flow-GRPO's code)
              = mean(−(z' − μ)²/(2·std²) − log std − ½·log 2π)     log_prob_form "gaussian"

    Undefined at σ_next = 0 (std = 0): the last step must be an ODE step (outside the SDE window).
    Shapes: v, z (B, ...) → StepOutput with log_prob (B,).
    """
    if log_prob_form not in CPS_LOG_PROBS:
        raise ValueError(f"cps_log_prob: must be one of {', '.join(CPS_LOG_PROBS)}, got {log_prob_form!r}")
    v, z, sigma, sigma_next = _in_compute_dtype(v, z, sigma, sigma_next)
    if float(sigma_next) <= 0.0:
        raise ValueError("cps: the final step (σ_next = 0) has zero variance; keep it outside the SDE window")
    std = sigma_next * math.sin(eta * math.pi / 2)
    x0 = z - sigma * v
    eps = z + (1 - sigma) * v
    mean = (1 - sigma_next) * x0 + torch.sqrt(sigma_next**2 - std**2) * eps
    return _finish(mean, std, prev_sample, noise, generator, log_prob_form)


def sliding_window(step: int, first: int, last: int, width: int, every: int, stride: int) -> tuple[int, int]:
    """The SDE window [start, start + width) of training step ``step`` (from 1) under a sliding schedule.

    MixGRPO's "progressive" schedule with overlap and roll-back (Tencent-Hunyuan/MixGRPO,
    fastvideo/utils/grpo_states.py, ``GRPOTrainingStates.update_iteration``; ``iters_per_group`` = every,
    ``prog_overlap_step`` = stride, ``roll_back``): the window starts at ``first``, moves ``stride`` steps
    toward low noise every ``every`` training steps, and after its last start (the largest first + k·stride
    <= ``last``) rolls back to ``first``. A pure function of the step, so a resumed run continues it exactly.
    """
    if step < 1 or every < 1 or stride < 1 or last < first or width < 1:
        raise ValueError(
            f"sliding window: needs step, every, stride, width >= 1 and last >= first, got "
            f"step={step} every={every} stride={stride} width={width} first={first} last={last}"
        )
    positions = (last - first) // stride + 1
    start = first + ((step - 1) // every % positions) * stride
    return start, start + width


# The steps of the registered SDE kinds (:mod:`jagg_engine.sde_kinds`): step j of a sampler, read from its
# schedule ``sigmas`` (T + 1,) and its options; ``draw`` is prev_sample / noise / generator (keywords).
# Shapes: v, z (B, ...) → StepOutput with log_prob (B,).


def flow_grpo_sampler_step(
    sampler: SamplerConfig, v: torch.Tensor, z: torch.Tensor, j: int, sigmas: torch.Tensor, **draw: Any
) -> StepOutput:
    """SDE kind "flow-grpo": :func:`flow_grpo_step` with σ_1 standing in for σ = 1 in std_t's denominator."""
    return flow_grpo_step(v, z, sigmas[j], sigmas[j + 1], sampler.eta, sigma_max=sigmas[1], **draw)


def dance_sampler_step(
    sampler: SamplerConfig, v: torch.Tensor, z: torch.Tensor, j: int, sigmas: torch.Tensor, **draw: Any
) -> StepOutput:
    """SDE kind "dance": :func:`dance_step`."""
    return dance_step(v, z, sigmas[j], sigmas[j + 1], sampler.eta, **draw)


def cps_sampler_step(
    sampler: SamplerConfig, v: torch.Tensor, z: torch.Tensor, j: int, sigmas: torch.Tensor, **draw: Any
) -> StepOutput:
    """SDE kind "cps": :func:`cps_step` with the sampler's ``cps_log_prob`` form."""
    return cps_step(v, z, sigmas[j], sigmas[j + 1], sampler.eta, log_prob_form=sampler.cps_log_prob, **draw)


def unit_kl_step_size(sampler: SamplerConfig, j: int, sigmas: torch.Tensor) -> float:
    """h_j = 1: the KL step size of a kind whose step std is already the whole noise scale (cps)."""
    return 1.0


@dataclass(frozen=True)
class SamplerConfig:
    """How a rollout is sampled, and so which steps are stochastic (and trained).

    kind:       a registered SDE kind (:data:`SDE_KINDS`: "flow-grpo", "dance", "cps", …) — the SDE whose
                Gaussian is the policy of one step.
    num_steps:  T, denoising steps from σ = 1 to σ = 0.
    eta:        noise level η of the SDE.
    shift:      time shift of the schedule (1 = uniform).
    sde_window: (start, end): steps start … end−1 are SDE steps (and the ones trained); the others are ODE
                steps (Flow-GRPO-Fast). None = every step, except the last for a kind whose last step is not
                stochastic (CPS).
    cps_log_prob: "flow-grpo" | "gaussian" — the CPS log-prob form (module docstring); other kinds ignore it.
    schedule:   σ_0 … σ_T given explicitly (T + 1 values, decreasing, e.g. a diffusers pipeline's scheduler
                grid: :func:`explicit_sigmas`), or None = uniform then shifted by ``shift`` (:func:`make_sigmas`).
    ode_solver: "euler" | "dpmpp-2m" — the solver of the ODE steps outside the SDE window (:func:`ode_segment`).
    ode_steps_before, ode_steps_after: steps of the ODE segment before / after the SDE window, re-spaced
                (:meth:`grid`; fewer is MixGRPO-Flash's compressed ODE part); None = the schedule's own count
                there. A window at the first (last) step has no segment before (after) it: ignored.
    """

    kind: str = "flow-grpo"
    num_steps: int = 12
    eta: float = 0.7
    shift: float = 1.0
    sde_window: tuple[int, int] | None = None
    cps_log_prob: str = "flow-grpo"
    schedule: tuple[float, ...] | None = None
    ode_solver: str = "euler"
    ode_steps_before: int | None = None
    ode_steps_after: int | None = None

    def __post_init__(self) -> None:
        get_sde(self.kind)  # an unknown kind raises, never falls back to another
        if int(self.num_steps) != self.num_steps or self.num_steps < 1:
            raise ValueError(f"steps: must be a positive integer, got {self.num_steps}")
        if not self.eta > 0:
            raise ValueError(f"eta: must be > 0, got {self.eta}")
        if self.cps_log_prob not in CPS_LOG_PROBS:
            raise ValueError(
                f"cps_log_prob: must be one of {', '.join(CPS_LOG_PROBS)}, got {self.cps_log_prob!r}"
            )
        if self.sde_window is not None:
            start, end = self.sde_window
            if not 0 <= start < end <= self.num_steps:
                raise ValueError(
                    f"sde_window: must satisfy 0 <= start < end <= {self.num_steps}, got {self.sde_window}"
                )
        if self.ode_solver not in ODE_SOLVERS:
            raise ValueError(f"ode_solver: must be one of {', '.join(ODE_SOLVERS)}, got {self.ode_solver!r}")
        for name in ("ode_steps_before", "ode_steps_after"):
            n = getattr(self, name)
            if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
                raise ValueError(f"{name}: must be an integer >= 1 or None, got {n}")

    def sigmas(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        if self.schedule is not None:
            return explicit_sigmas(self.schedule, self.num_steps, dtype)
        return make_sigmas(self.num_steps, self.shift, dtype)

    def grid(self, dtype: torch.dtype = torch.float64) -> SamplingGrid:
        """The σ grid a rollout walks: the schedule :meth:`sigmas` with its ODE segment before the SDE window
        re-spaced to ``ode_steps_before`` steps and the one after it to ``ode_steps_after`` (:func:`respace`);
        the window's own steps are the schedule's. With both None it is :meth:`sigmas` and :meth:`sde_steps`
        unchanged. Shapes: sigmas (T' + 1,), T' = before + window + after steps.
        """
        base = self.sigmas(dtype)
        steps = self.sde_steps()
        if not steps:
            return SamplingGrid(base, [], (self.num_steps, self.num_steps))
        start, end, T = steps[0], steps[-1] + 1, self.num_steps
        n_before = 0 if start == 0 else self.ode_steps_before or start
        n_after = 0 if end == T else self.ode_steps_after or T - end
        before = respace(base, 0, start, n_before, self.shift)  # (n_before + 1,), ends at σ_start
        after = respace(base, end, T, n_after, self.shift)  # (n_after + 1,), starts at σ_end
        sigmas = torch.cat([before[:-1], base[start:end], after])  # (T' + 1,)
        return SamplingGrid(sigmas, list(range(n_before, n_before + end - start)), (start, end))

    def sde_steps(self) -> list[int]:
        """Indices of the stochastic (trained) steps, in denoising order."""
        start, end = self.sde_window or (0, self.num_steps)
        if not get_sde(self.kind).last_step_stochastic:
            end = min(end, self.num_steps - 1)
        return list(range(start, end))

    def step(self, v, z, j: int, sigmas: torch.Tensor, prev_sample=None, noise=None, generator=None):
        """The SDE step j of this sampler: its kind's registered step (see :func:`flow_grpo_sampler_step` and
        friends). Returns StepOutput."""
        step = get_sde(self.kind).step_fn()
        return step(self, v, z, j, sigmas, prev_sample=prev_sample, noise=noise, generator=generator)

    def kl_step_size(self, j: int, sigmas: torch.Tensor) -> torch.Tensor | float:
        """h_j of :func:`jagg_engine.grpo.step_kl`: the step std is g·sqrt(h_j) with g the noise scale Flow-GRPO's
        ``sde_step_with_logprob`` returns as ``std_dev_t``.

        flow-grpo, dance (Euler–Maruyama steps): h_j = σ_j − σ_{j+1}, g = η·sqrt(σ/(1 − σ)) resp. η.
        cps: h_j = 1 — Flow-GRPO's CPS branch returns the step's own std, σ_next·sin(η·π/2).
        A registered kind says which (its ``kl_step_size``; none = the Euler–Maruyama σ_j − σ_{j+1}).
        """
        h = get_sde(self.kind).kl_step_size_fn()
        if h is not None:
            return h(self, j, sigmas)
        return sigmas[j] - sigmas[j + 1]  # scalar tensor, no device sync


@dataclass
class Trajectory:
    """A rollout batch. T steps, B samples, latent shape S.

    latents:    (T + 1, B, *S)  z_0 (noise) … z_T (final sample), stored in the compute dtype
    log_probs:  (T, B)          old log π(z_{j+1} | z_j) of SDE steps (0 for ODE steps)
    sigmas:     (T + 1,)        σ_j
    sde_steps:  the stochastic steps, in order (only these are trained)
    cond:       batch-first conditioning pytree
    velocities: (n_kept, B, *S) or None — v̂_j as sampled at the grid steps ``velocity_steps`` (all T with
                ``store_velocities=True``, the steps given otherwise); read one with :meth:`velocity`
    velocity_steps: the grid steps whose v̂_j are in ``velocities``, in order
    policy:     the policy that sampled, with the velocities (see :class:`PolicyState`)
    forwards:   model calls made while sampling, in calls over the whole batch (a call on b of the B
                samples counts b / B): T' without a shared prefix
    """

    latents: torch.Tensor
    log_probs: torch.Tensor
    sigmas: torch.Tensor
    sde_steps: list[int]
    cond: Cond
    velocities: torch.Tensor | None = None
    policy: PolicyState | None = None
    forwards: float = 0.0
    velocity_steps: tuple[int, ...] = ()

    @property
    def batch_size(self) -> int:
        return self.latents.shape[1]

    def velocity(self, j: int) -> torch.Tensor:
        """v̂_j as sampled at grid step j (B, *S); a step whose velocity was not kept is a ValueError."""
        if self.velocities is None or j not in self.velocity_steps:
            kept = ", ".join(map(str, self.velocity_steps)) or "none"
            raise ValueError(f"velocity of step {j}: not kept by the rollout (kept: {kept})")
        return self.velocities[self.velocity_steps.index(j)]

    def select(self, index: slice | torch.Tensor) -> Trajectory:
        """The sub-batch ``index`` of every per-sample tensor (latents, log-probs, cond, velocities)."""
        return Trajectory(
            latents=self.latents[:, index],
            log_probs=self.log_probs[:, index],
            sigmas=self.sigmas,
            sde_steps=self.sde_steps,
            cond=index_cond(self.cond, index),
            velocities=None if self.velocities is None else self.velocities[:, index],
            policy=self.policy,
            forwards=self.forwards,
            velocity_steps=self.velocity_steps,
        )


@torch.no_grad()
def rollout(
    model: VelocityFn,
    cond: Cond,
    noise: torch.Tensor,
    sampler: SamplerConfig,
    generator: torch.Generator | None = None,
    store_velocities: bool | Collection[int] = False,
    micro_batch: int | None = None,
    prefix_group: int | None = None,
) -> Trajectory:
    """Sample a batch from z_0 = ``noise`` (B, *S), recording latents and old log-probs.

    The rollout walks the sampler's :meth:`SamplerConfig.grid` (T' steps). SDE steps add noise drawn from
    ``generator`` for the whole batch before the first model call, ε (n_sde, B, *S), so sample i's trajectory
    is a function of (noise[i], ε[:, i]) whatever the split into micro-batches of ``micro_batch`` samples
    (None = one call per step for the whole batch). ODE steps (outside the SDE window) are deterministic,
    solved by the sampler's ``ode_solver``. With ``store_velocities`` the v̂_j and the sampling policy's state
    are kept: True keeps every grid step's, a collection of grid steps only theirs (the trainer passes the
    inner steps of its JAGG groups, the only ones velocity reuse reads); an empty one keeps nothing.

    Shared prefix (``prefix_group`` = G): samples g·G … g·G + G − 1 share their noise (DanceGRPO's
    ``init_same_noise``), so their deterministic steps before the SDE window are the same: they are computed
    once per group, on noise[::G], and broadcast to the G samples — 1/G of the prefix forwards. Noise or
    conditioning (prompts) that is not shared within the groups is refused.
    """
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch: must be an integer >= 1 or None, got {micro_batch}")
    dtype = compute_dtype(noise.dtype)
    grid = sampler.grid(dtype)
    sigmas = grid.sigmas.to(noise.device)
    sde_steps = grid.sde_steps
    B = noise.shape[0]
    if store_velocities is True:
        keep: tuple[int, ...] | None = tuple(range(len(sigmas) - 1))
    elif store_velocities is False:
        keep = None
    else:
        keep = tuple(sorted(set(store_velocities))) or None
        if keep and not 0 <= keep[0] <= keep[-1] < len(sigmas) - 1:
            raise ValueError(f"store_velocities: steps must lie in 0 … {len(sigmas) - 2}, got {list(keep)}")
    eps = torch.randn((len(sde_steps), *noise.shape), generator=generator, device=noise.device, dtype=dtype)
    z = noise.to(dtype)
    prefix = sde_steps[0] if sde_steps and prefix_group and prefix_group > 1 else 0
    run = {"model": model, "sampler": sampler, "sigmas": sigmas, "sde": sde_steps, "store": keep}
    head, calls = None, 0.0
    if prefix:
        G = int(prefix_group)
        if B % G or not torch.equal(z, z[::G].repeat_interleave(G, 0)):
            raise ValueError(
                f"group_noise: a shared prefix needs the noise of each group of {G} samples to be the same"
            )
        if not _same_within_groups(cond, G):
            raise ValueError(
                f"group_noise: a shared prefix needs one conditioning (one prompt) for each group of {G} samples"
            )
        head, c = _rollout_parts(
            z[::G], index_cond(cond, slice(None, None, G)), eps[:, ::G], 0, prefix, micro_batch, **run
        )
        head = [None if x is None else x.repeat_interleave(G, 1) for x in head]  # (prefix (+1), B, …)
        calls += c
        z = head[0][-1]
    tail, c = _rollout_parts(z, cond, eps, prefix, len(sigmas) - 1, micro_batch, **run)
    calls += c
    if head is not None:
        tail = [
            None if t is None else torch.cat([h[:-1] if k == 0 else h, t])
            for k, (h, t) in enumerate(zip(head, tail))
        ]
    latents, log_probs, velocities = tail
    policy = None
    if keep is not None:
        policy = policy_state(model, noise.to(dtype), sigmas[0].expand(B), cond)
    return Trajectory(
        latents=latents,  # (T' + 1, B, *S)
        log_probs=log_probs,  # (T', B)
        sigmas=sigmas,
        sde_steps=sde_steps,
        cond=cond,
        velocities=velocities,  # (n_kept, B, *S) or None
        policy=policy,
        forwards=calls / B,
        velocity_steps=keep or (),
    )


def _same_within_groups(cond: Cond, G: int) -> bool:
    """Whether every batch-first tensor leaf of ``cond`` holds one value per group of G consecutive samples."""
    if isinstance(cond, torch.Tensor):
        return cond.dim() == 0 or torch.equal(cond, cond[::G].repeat_interleave(G, 0))
    if isinstance(cond, dict):
        return all(_same_within_groups(v, G) for v in cond.values())
    if isinstance(cond, (list, tuple)):
        return all(_same_within_groups(v, G) for v in cond)
    return True


def _rollout_parts(
    z: torch.Tensor,
    cond: Cond,
    eps: torch.Tensor,
    first: int,
    last: int,
    micro_batch: int | None,
    **run: Any,
) -> tuple[list[torch.Tensor | None], float]:
    """Steps first … last − 1 of the grid for the batch z (b, *S), in micro-batches: [latents (n + 1, b, *S),
    log-probs (n, b), velocities (n_kept, b, *S) or None], and the samples forwarded (Σ over model calls of their
    batch size)."""
    b_all = z.shape[0]
    b = micro_batch or b_all
    parts = []
    for i in range(0, b_all, b):
        index = slice(i, min(i + b, b_all))
        parts.append(_rollout_part(z[index], index_cond(cond, index), eps[:, index], first, last, **run))
    out = [None if parts[0][k] is None else torch.cat([p[k] for p in parts], 1) for k in range(3)]
    return out, float(b_all * (last - first))


def _rollout_part(
    z: torch.Tensor,
    cond: Cond,
    eps: torch.Tensor,
    first: int,
    last: int,
    model: VelocityFn,
    sampler: SamplerConfig,
    sigmas: torch.Tensor,
    sde: list[int],
    store: tuple[int, ...] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Steps first … last − 1 of the grid ``sigmas`` for one micro-batch: z (b, *S), eps (n_sde, b, *S) →
    latents (n + 1, b, *S), log-probs (n, b), velocities of the steps in ``store`` (n_kept, b, *S) or None. ODE steps go through one
    :func:`ode_segment` per run of consecutive ODE steps."""
    b = z.shape[0]
    sde_index = {j: k for k, j in enumerate(sde)}
    latents, log_probs, velocities = [z], [], []
    segment = None
    for j in range(first, last):
        v = model(z, sigmas[j].expand(b), cond)
        if store is not None and j in store:
            velocities.append(v.to(z.dtype))
        if j in sde_index:
            out = sampler.step(v, z, j, sigmas, noise=eps[sde_index[j]])
            z, lp = out.prev_sample, out.log_prob
            segment = None
        else:
            if segment is None:
                end = min([k for k in sde if k > j], default=len(sigmas) - 1)
                segment = ode_segment(sampler.ode_solver, sigmas, j, end)
            z, lp = segment.step(v, z, j), torch.zeros(b, dtype=z.dtype, device=z.device)
        latents.append(z)
        log_probs.append(lp)
    return (
        torch.stack(latents),
        torch.stack(log_probs) if log_probs else z.new_zeros((0, b)),
        (torch.stack(velocities) if velocities else z.new_zeros((0, *z.shape)))
        if store is not None
        else None,
    )


@torch.no_grad()
def ode_sample(
    model: VelocityFn,
    cond: Cond,
    noise: torch.Tensor,
    num_steps: int,
    shift: float = 1.0,
    schedule: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """Deterministic Euler sampling of the flow ODE from z_0 = ``noise`` (B, *S) → final z_T (B, *S).

    Used for evaluation (the trainer's and `jagg eval`'s): fixed prompts and seeds (:func:`eval_noise`) give
    the same images for every run, so two runs can be compared image by image. ``schedule``: an explicit σ
    grid as :attr:`SamplerConfig.schedule` (None = uniform, shifted by ``shift``).
    """
    dtype = compute_dtype(noise.dtype)
    if schedule is not None:
        sigmas = explicit_sigmas(schedule, num_steps, dtype).to(noise.device)
    else:
        sigmas = make_sigmas(num_steps, shift, dtype).to(noise.device)
    z = noise.to(dtype)
    for j in range(num_steps):
        z = ode_step(model(z, sigmas[j].expand(z.shape[0]), cond), z, sigmas[j], sigmas[j + 1])
    return z


def eval_noise(latent_shape: tuple[int, ...] | list[int], prompt_index: int, seed: int) -> torch.Tensor:
    """The fixed noise of eval prompt ``prompt_index`` under eval seed ``seed``: a CPU generator seeded
    seed·100003 + prompt_index, so a sample depends on neither the batch nor the other prompts. (*latent_shape)"""
    g = torch.Generator().manual_seed(seed * 100_003 + prompt_index)
    return torch.randn(tuple(latent_shape), generator=g)
