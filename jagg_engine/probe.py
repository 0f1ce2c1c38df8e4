"""Gradient-fidelity probe: per group, the JAGG (and endpoint-only) gradient against the exact one.

For every group k of the rollout it runs the SAME group routines as the policy update (``run_single_group``)
and compares the flattened gradients over the trainable parameters:

    cosine_k    = ⟨g_jagg, g_exact⟩ / (‖g_jagg‖·‖g_exact‖)
    rel_error_k = ‖g_jagg − g_exact‖ / ‖g_exact‖

and, from the per-group gradients, the whole-update cosine for a routing fraction f (the first ceil(f·G)
groups by JAGG, the rest exact). The late, low-noise steps carry most of the gradient norm, so a whole-update
figure can hide a weak group: read both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .backbones.base import VelocityFn
from .cost import make_groups, num_routed_groups
from .jagg import UpdateConfig, run_single_group
from .sde import SamplerConfig, Trajectory


@dataclass
class GroupProbe:
    index: int
    t_start: float
    t_end: float
    cosine: float
    rel_error: float
    endpoint_cosine: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["endpoint_cosine"] is None:
            del d["endpoint_cosine"]
        return d


def _flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten() for p in params]
    )


def _zero(params: list[torch.nn.Parameter]) -> None:
    for p in params:
        p.grad = None


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def rel_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx.double() - exact.double()).norm() / exact.double().norm().clamp_min(1e-300))


def group_gradients(
    model: VelocityFn,
    params: list[torch.nn.Parameter],
    traj: Trajectory,
    advantages: torch.Tensor,
    update: UpdateConfig,
    sampler: SamplerConfig,
    kinds: tuple[str, ...] = ("exact", "jagg"),
) -> list[dict[str, torch.Tensor]]:
    """For each group, the flattened gradient of each strategy in ``kinds``. Leaves ``.grad`` cleared."""
    out = []
    for steps in make_groups(traj.sde_steps, update.window):
        grads = {}
        for kind in kinds:
            _zero(params)
            run_single_group(model, traj, advantages, update, sampler, steps, kind)
            grads[kind] = _flat_grad(params)
        out.append(grads)
    _zero(params)
    return out


def probe_groups(
    model: VelocityFn,
    params: list[torch.nn.Parameter],
    traj: Trajectory,
    advantages: torch.Tensor,
    update: UpdateConfig,
    sampler: SamplerConfig,
    with_endpoint: bool = False,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    totals: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[list[GroupProbe], dict[str, float]]:
    """Per-group fidelity table and whole-update cosines ``{"jagg_frac=F": cos}`` for F in 0.2 … 1.0.

    ``reduce``: applied to the stacked gradients (G, kinds, P) before any cosine, e.g. a sum over
    data-parallel ranks, so that every rank measures the gradient of the batch of all ranks.
    ``totals``: called with the whole update's exact gradient and the one the update's routing computes (its
    first ceil(jagg_frac·G) groups by JAGG, the rest exact), (P,) each: e.g. :class:`jagg_engine.bias.LiveBias`.
    """
    kinds = ("exact", "jagg", "endpoint") if with_endpoint else ("exact", "jagg")
    grads = group_gradients(model, params, traj, advantages, update, sampler, kinds)
    if reduce is not None:
        stacked = reduce(torch.stack([torch.stack([g[k] for k in kinds]) for g in grads]))  # (G, kinds, P)
        grads = [{k: stacked[i, j] for j, k in enumerate(kinds)} for i in range(len(grads))]
    groups = make_groups(traj.sde_steps, update.window)
    rows = []
    for k, (steps, g) in enumerate(zip(groups, grads)):
        rows.append(
            GroupProbe(
                index=k,
                t_start=float(traj.sigmas[steps[0]]),
                t_end=float(traj.sigmas[steps[-1]]),
                cosine=cosine(g["jagg"], g["exact"]),
                rel_error=rel_error(g["jagg"], g["exact"]),
                endpoint_cosine=cosine(g["endpoint"], g["exact"]) if with_endpoint else None,
            )
        )
    exact_total = sum(g["exact"] for g in grads)
    if totals is not None:
        routed = num_routed_groups(len(grads), update.jagg_frac)
        totals(exact_total, sum(g["jagg"] if k < routed else g["exact"] for k, g in enumerate(grads)))
    whole = {}
    for f in (0.2, 0.4, 0.6, 0.8, 1.0):
        n = num_routed_groups(len(grads), f)
        approx = sum(g["jagg"] if k < n else g["exact"] for k, g in enumerate(grads))
        whole[f"jagg_frac={f:g}"] = cosine(approx, exact_total)
    if with_endpoint:
        whole["endpoint"] = cosine(sum(g["endpoint"] for g in grads), exact_total)
    return rows, whole
