"""The flow ODE and the arithmetic every step shares (its compute dtype, the Euler step) and, outside the SDE
window: the σ grid of the ODE segments (re-spaced in the unshifted time) and their solvers,
Euler and diffusers' DPM-Solver++ (order 2, flow sigmas and flow prediction), a fresh history per segment."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype SDE/PPO math runs in: float32 for bf16/fp16/fp32 models, float64 for float64 ones."""
    return torch.promote_types(dtype, torch.float32)


def _as(x: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def _in_compute_dtype(
    v: torch.Tensor, z: torch.Tensor, sigma: float | torch.Tensor, sigma_next: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """v̂, z, σ, σ_next as tensors in the step's compute dtype (float32 at least, see :func:`compute_dtype`)."""
    dtype = compute_dtype(v.dtype)
    z = z.to(dtype)
    return v.to(dtype), z, _as(sigma, z), _as(sigma_next, z)


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """Time shift of SD3 / Flux: σ' = s·σ / (1 + (s − 1)·σ); shift > 1 spends more steps at high noise."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def ode_step(v: torch.Tensor, z: torch.Tensor, sigma: float | torch.Tensor, sigma_next: float | torch.Tensor):
    """Deterministic Euler step of the flow ODE: z' = z + (σ_next − σ)·v̂. (B, ...) → (B, ...)."""
    v, z, sigma, sigma_next = _in_compute_dtype(v, z, sigma, sigma_next)
    return z + (sigma_next - sigma) * v


ODE_SOLVERS = ("euler", "dpmpp-2m")


class SamplingGrid(NamedTuple):
    sigmas: torch.Tensor  # (T' + 1,) the σ a rollout walks, ODE segments re-spaced
    sde_steps: list[int]  # the SDE (trained) steps, indices into ``sigmas``
    window: tuple[int, int]  # the SDE window [start, end) in the schedule's own step indices


def unshift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The inverse of :func:`shift_sigmas`: u = σ' / (s − (s − 1)·σ')."""
    return sigmas / (shift - (shift - 1) * sigmas)


def respace(sigmas: torch.Tensor, a: int, b: int, n: int, shift: float = 1.0) -> torch.Tensor:
    """The schedule's segment σ_a … σ_b re-spaced to ``n`` steps: n + 1 points, σ_a and σ_b kept exactly, the
    inner ones uniform in the unshifted time u (linear interpolation of u over the step index), then shifted.

    As MixGRPO-Flash rebuilds its ODE part after the window (Tencent-Hunyuan/MixGRPO,
    fastvideo/utils/sampling_utils.py, ``dpm_apply_strategy == "post"``: ``linspace`` in t, then
    ``sd3_time_shift``); for this project's shifted-uniform schedule it is exactly the n-step schedule of the
    segment. n = b − a returns ``sigmas[a : b + 1]`` itself. Shapes: sigmas (T + 1,) → (n + 1,).
    """
    if n == b - a:
        return sigmas[a : b + 1]
    u = unshift_sigmas(sigmas.to(torch.float64), shift)  # (T + 1,)
    x = torch.linspace(float(a), float(b), n + 1, dtype=torch.float64)  # fractional step indices
    lo = x.floor().long().clamp(max=len(u) - 2)
    frac = x - lo
    out = shift_sigmas(u[lo] + frac * (u[lo + 1] - u[lo]), shift).to(sigmas.dtype)
    out[0], out[-1] = sigmas[a], sigmas[b]
    return out


class EulerSegment:
    """Euler over an ODE segment: z' = z + (σ_{j+1} − σ_j)·v̂ (:func:`ode_step`)."""

    def __init__(self, sigmas: torch.Tensor, first: int, last: int) -> None:
        self.sigmas = sigmas

    def step(self, v: torch.Tensor, z: torch.Tensor, j: int) -> torch.Tensor:
        return ode_step(v, z, self.sigmas[j], self.sigmas[j + 1])


class DPMSolverSegment:
    """DPM-Solver++(2M) over one ODE segment σ_first … σ_last of a grid, with the flow parametrisation:
    diffusers' ``DPMSolverMultistepScheduler`` (algorithm_type "dpmsolver++", solver_order 2, use_flow_sigmas,
    prediction_type "flow_prediction": x̂0 = z − σ·v̂, α = 1 − σ) stepping on exactly the segment's σ. Each
    segment starts a fresh multistep history (its first step is first order); see :func:`dpm_solver_config`
    for its last step. MixGRPO-Flash samples its ODE part with this solver (Tencent-Hunyuan/MixGRPO,
    fastvideo/utils/sampling_utils.py, ``dpm_step``).
    """

    def __init__(self, sigmas: torch.Tensor, first: int, last: int) -> None:
        from diffusers import DPMSolverMultistepScheduler  # lazy: only this solver needs diffusers

        self.first = first
        self.scheduler = DPMSolverMultistepScheduler(**dpm_solver_config(float(sigmas[last])))
        set_flow_sigmas(self.scheduler, sigmas[first : last + 1])

    def step(self, v: torch.Tensor, z: torch.Tensor, j: int) -> torch.Tensor:
        out = self.scheduler.step(v, self.scheduler.timesteps[j - self.first], z, return_dict=False)[0]
        return out.to(z.dtype)


def dpm_solver_config(sigma_end: float) -> dict[str, Any]:
    """The ``DPMSolverMultistepScheduler`` options of a dpmpp-2m segment ending at σ = ``sigma_end``.

    A segment ending at σ = 0 (after the window) takes its last step at first order, as the scheduler does at
    the end of sampling (``final_sigmas_type="zero"``: λ = log(α/σ) is infinite there, the step returns x̂0).
    A segment ending inside the schedule (before the window) keeps second order to its end
    (``lower_order_final=False``): its last step is not the end of sampling.
    """
    options: dict[str, Any] = dict(
        algorithm_type="dpmsolver++", solver_order=2, use_flow_sigmas=True, prediction_type="flow_prediction"
    )
    if sigma_end > 0:
        return {**options, "final_sigmas_type": "sigma_min", "lower_order_final": False}
    return {**options, "final_sigmas_type": "zero"}


def set_flow_sigmas(scheduler: Any, sigmas: torch.Tensor) -> None:
    """Point a diffusers flow scheduler at the σ grid ``sigmas`` (n + 1,) and reset its state: the state
    ``set_timesteps`` leaves (empty multistep history, step index from 0), with these σ (kept in their dtype,
    on the CPU as diffusers keeps them) and timesteps σ·num_train_timesteps."""
    scheduler.set_timesteps(num_inference_steps=len(sigmas) - 1)
    scheduler.sigmas = sigmas.detach().cpu()
    scheduler.timesteps = sigmas[:-1].detach().cpu() * scheduler.config.num_train_timesteps
    scheduler.num_inference_steps = len(sigmas) - 1
    scheduler.set_begin_index(0)


ODE_SEGMENTS = {"euler": EulerSegment, "dpmpp-2m": DPMSolverSegment}


def ode_segment(solver: str, sigmas: torch.Tensor, first: int, last: int) -> EulerSegment | DPMSolverSegment:
    """The solver of the ODE steps first … last − 1 of the grid ``sigmas`` (one segment: no SDE step inside)."""
    if solver not in ODE_SEGMENTS:
        raise ValueError(f"ode_solver: must be one of {', '.join(ODE_SOLVERS)}, got {solver!r}")
    return ODE_SEGMENTS[solver](sigmas, first, last)
