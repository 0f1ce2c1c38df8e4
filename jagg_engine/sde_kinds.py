"""The SDE-kind registry: one entry per SDE a rollout can sample with (the config's ``algorithm``).

Everything else reads the entries: :class:`jagg_engine.sde.SamplerConfig` takes its steps, its trained steps
and its KL step size from them, the config validator its allowed names and η bound, the app its dropdown.
An unknown name is an error, never a fallback.

An entry (:class:`SDEKind`):
    step                  ``step(sampler, v, z, j, sigmas, *, prev_sample=None, noise=None, generator=None)``
                          → :class:`jagg_engine.sde.StepOutput`: SDE step j of ``sampler`` (a SamplerConfig,
                          for η and kind options) from z_j at σ_j = sigmas[j] to z_{j+1} at sigmas[j + 1]
    last_step_stochastic  whether the last step (σ_next = 0) may be an SDE step; False keeps it an ODE step
                          (CPS: its Gaussian has zero variance there)
    kl_step_size          ``h(sampler, j, sigmas)``: h_j of :func:`jagg_engine.grpo.step_kl`; None = the
                          Euler–Maruyama step σ_j − σ_{j+1}
    max_eta               the largest η the kind accepts (None: any η > 0)

``step`` and ``kl_step_size`` are functions or ``"module:function"`` references (:func:`jagg_engine.plugins.resolve`),
imported the first time a sampler steps: this module imports no torch, so listing the names stays cheap.
Register a new kind with :func:`register_sde` from the module that defines its step (a user's module is
imported by the config's ``plugins`` field).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .plugins import resolve


@dataclass(frozen=True)
class SDEKind:
    """One SDE kind; see the module docstring."""

    name: str
    step: str | Callable[..., Any]
    last_step_stochastic: bool = True
    kl_step_size: str | Callable[..., Any] | None = None
    max_eta: float | None = None
    help: str = ""

    def step_fn(self) -> Callable[..., Any]:
        return resolve(self.step)

    def kl_step_size_fn(self) -> Callable[..., Any] | None:
        return None if self.kl_step_size is None else resolve(self.kl_step_size)


SDE_KINDS: dict[str, SDEKind] = {}


def register_sde(
    name: str,
    step: str | Callable[..., Any],
    *,
    last_step_stochastic: bool = True,
    kl_step_size: str | Callable[..., Any] | None = None,
    max_eta: float | None = None,
    help: str = "",
) -> SDEKind:
    """Register (or replace) the SDE kind ``name``; returns its entry."""
    if not name or not isinstance(name, str):
        raise ValueError(f"algorithm: an SDE kind needs a non-empty name, got {name!r}")
    if max_eta is not None and not max_eta > 0:
        raise ValueError(f"max_eta: must be > 0 or None, got {max_eta}")
    kind = SDEKind(name, step, last_step_stochastic, kl_step_size, max_eta, help)
    SDE_KINDS[name] = kind
    return kind


def get_sde(name: str) -> SDEKind:
    """The entry of ``name``; ValueError ``algorithm: must be one of …`` (one line) when it is not registered."""
    if name not in SDE_KINDS:
        raise ValueError(f"algorithm: must be one of {', '.join(SDE_KINDS)}, got {name!r}")
    return SDE_KINDS[name]


register_sde(
    "flow-grpo",
    "jagg_engine.sde:flow_grpo_sampler_step",
    help="Flow-GRPO's reverse SDE of rectified flow (Liu et al. 2025, eq. 9–10)",
)
register_sde(
    "dance",
    "jagg_engine.sde:dance_sampler_step",
    help="DanceGRPO's flow SDE (Xue et al. 2025)",
)
register_sde(
    "cps",
    "jagg_engine.sde:cps_sampler_step",
    last_step_stochastic=False,
    kl_step_size="jagg_engine.sde:unit_kl_step_size",
    max_eta=1.0,
    help="coefficients-preserving sampling (Wang & Yu 2025); the last step stays an ODE step",
)
