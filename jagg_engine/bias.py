"""The bias of JAGG's EXPECTED gradient: what a per-batch cosine cannot see.

A per-batch cosine compares JAGG and the exact backward on the SAME rollout, so most of both gradients is that
batch's own sampling noise, which they share. The optimiser averages the noise away and follows the expected
gradient; JAGG's differs from the exact one by its interpolation error summed over the inner steps,

    E[g_jagg − g_exact] = Σ_j E[e_j],      e_j = ((1 − α_j)·J_0 + α_j·J_{W−1} − J_j)ᵀ s_j        (PAPER.md)

and nothing makes that vanish where E[g_exact] does. This module measures it over K independent rollouts
(x̄: the mean over the rollouts; d = g_jagg − g_exact; E: the expectation over rollouts):

    cos_expected     cos(ḡ_jagg, ḡ_exact)
    rel_bias         ‖d̄‖ / ‖ḡ_exact‖
    bias_along       ⟨d̄, ḡ_exact⟩ / ‖ḡ_exact‖²: the share of the gradient the bias adds along it (negative: it
                     shrinks the signal)
    signal_share_u   ‖E g_exact‖² over the mean ‖g_exact,k‖²: the share of one rollout's gradient that is signal
                     (resolving E g_exact takes K of several times its inverse)
    noise_floor      cos and rel between the exact means of two halves of the rollouts (even and odd groups):
                     how far K resolves an expected gradient at all
    per inner step j the credit error ‖ē_j‖ / ‖ḡ_exact‖ at JAGG's α_j, its share along ḡ_exact, and the α that
                     minimises it, α*_j = ⟨ū_j, w̄_j⟩ / ‖ū_j‖² with its credit error, where e_j = α·u_j − w_j,
                     u_j = b_j − a_j, w_j = c_j − a_j, a_j = J_0ᵀ s_j, b_j = J_{W−1}ᵀ s_j, c_j = J_jᵀ s_j

Those are figures of MEANS, and a mean over a few rollouts of a GRPO gradient is mostly noise: its norm is too
large and two of them point apart. So each figure also comes unbiased (``*_u``): every ⟨E x, E y⟩ in it is the
U-statistic (⟨Σ_k x_k, Σ_k y_k⟩ − Σ_k ⟨x_k, y_k⟩) / (K(K − 1)), which leaves each rollout's product with itself
out, so noise adds nothing in expectation — with a jackknife standard error (``*_se``) over 8 interleaved
groups of rollouts (K ≥ 16). A bias is resolved where ``rel_bias_u`` stands several standard errors above 0.

Every vector is over the trainable parameters, accumulated in float64. The gradients come from the engine's
own group routines' calls (:class:`jagg_engine.jagg.UpdateState`: the same per-step losses, micro-batches and
scaling as the update), each vector-Jacobian product by ``torch.autograd.grad`` on one step's forward.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .backbones.base import VelocityFn
from .credit import group_shift, interpolation_weights, jagg_alpha
from .jagg import UpdateConfig, UpdateState, group_plan
from .sde import SamplerConfig, Trajectory


@dataclass
class InnerStep:
    """One inner step j of a JAGG group and its three vector-Jacobian products on one rollout (P,) each:
    c = J_jᵀ s_j (exact), a = J_0ᵀ s_j and b = J_{W−1}ᵀ s_j (the endpoints'); JAGG credits (1 − α)·a + α·b."""

    group: int
    step: int
    t: float
    alpha: float  # the weight the run's update gives the far endpoint (the paper's α_j times alpha_scale)
    alpha_paper: float  # the paper's α_j = (t_0 − t_j) / (t_0 − t_{W−1})
    c: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    b_rep: torch.Tensor | None = None  # J(z̃_{W−1})ᵀ s_j at a replica of the far state (``replicas``)
    b_cross: torch.Tensor | None = (
        None  # Σ_i J(z^{π(i)}_{W−1})ᵀ s_ij: another sample's far state (``cross_group``)
    )


@dataclass
class RolloutGradients:
    """One rollout's exact and JAGG gradients (P,) and its inner steps' pieces."""

    exact: torch.Tensor
    jagg: torch.Tensor
    inner: list[InnerStep] = field(default_factory=list)


def _vjp(output: torch.Tensor, upstream: torch.Tensor, params: list[torch.nn.Parameter]) -> torch.Tensor:
    """(∂output/∂θ)ᵀ·upstream, flattened over ``params`` in float64; the graph is kept for the next product."""
    grads = torch.autograd.grad(
        output, params, upstream.to(output.dtype), retain_graph=True, allow_unused=True
    )
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).double().flatten() for p, g in zip(params, grads)]
    )


def replica_far_velocity(
    state: UpdateState, steps: list[int], k: int, v_k: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """v̂ with grad at a replica z̃_{W−1} of the group's far state: from the rollout's own z_j (j = ``steps[k]``,
    velocity ``v_k``) the SDE steps j … W−2 re-sampled with fresh noise from ``generator`` (no-grad forwards
    in between). z̃_{W−1} follows the path up to z_j and is independent of the noise ε_j … ε_{W−2} the rollout
    injected, which s_j is correlated with: J(z̃_{W−1})ᵀ s_j is the far endpoint's credit without that coupling.
    Shape: (b, *S)."""
    traj = state.traj
    if steps != list(range(steps[0], steps[-1] + 1)):
        raise ValueError(f"replicas: a group of consecutive grid steps, got {steps}")
    z, v = traj.latents[steps[k]], v_k.detach()
    for i in range(k, len(steps) - 1):
        j = steps[i]
        if i > k:
            with torch.no_grad():
                v = state.model(z, state.t(j), traj.cond)
        noise = torch.randn(z.shape, generator=generator, dtype=z.dtype, device="cpu").to(z.device)
        z = state.sampler.step(v, z, j, traj.sigmas, noise=noise).prev_sample.detach()
    return state.model(z, state.t(steps[-1]), traj.cond)


def rollout_gradients(
    model: VelocityFn,
    params: list[torch.nn.Parameter],
    traj: Trajectory,
    advantages: torch.Tensor,
    update: UpdateConfig,
    sampler: SamplerConfig,
    ref_model: VelocityFn | None = None,
    replicas: torch.Generator | None = None,
    cross_group: int | None = None,
) -> RolloutGradients:
    """The exact and JAGG gradients of one rollout under ``update``'s grouping and routing (JAGG's own estimate:
    no control variate), and each inner step's c, a, b (:class:`InnerStep`). Every trained step is forwarded
    once with grad per micro-batch; g_exact = Σ_j c_j, g_jagg = Σ_ends c + Σ_inner (1 − α_j)·a_j + α_j·b_j
    (exact groups count c_j in both). ``replicas``: a generator; each inner step also gets b_rep, the far
    endpoint's product at a replica of z_{W−1} (:func:`replica_far_velocity`). ``cross_group`` = G: each inner
    step also gets b_cross, its credits at the far endpoint of the NEXT sample of the same group of G
    (:func:`jagg_engine.credit.group_shift`: the far credit of ``far_credit=cross``)."""
    update = dataclasses.replace(update, cv_frac=0.0)
    state = UpdateState(model, traj, advantages, update, sampler, ref_model, rollout_policy=False)
    plan = group_plan(traj.sde_steps, update)
    n = sum(p.numel() for p in params)
    exact = torch.zeros(n, dtype=torch.float64)
    jagg = torch.zeros(n, dtype=torch.float64)
    inner: dict[int, InnerStep] = {}
    for index in state.micro_batches():
        state.use_samples(index)
        if cross_group and (index.start % cross_group or (index.stop - index.start) % cross_group):
            raise ValueError(
                f"micro_batch: the cross-fitted credit needs whole groups of {cross_group} in each micro-batch, "
                f"got samples {index.start}-{index.stop - 1}"
            )
        for g, (steps, kind) in enumerate(plan):
            vs = {j: state.forward([j], grad=True) for j in steps}  # (b, *S) each
            ss = {j: state.upstream(vs[j], j) for j in steps}
            routed = kind == "jagg" and len(steps) > 2
            alpha = jagg_alpha(traj.sigmas[steps], update.alpha_scale) if routed else None
            paper = interpolation_weights(traj.sigmas[steps]) if routed else None
            for k, j in enumerate(steps):
                c = _vjp(vs[j], ss[j], params)
                exact += c
                if not routed or k in (0, len(steps) - 1):
                    jagg += c
                    continue
                a = _vjp(vs[steps[0]], ss[j], params)
                b = _vjp(vs[steps[-1]], ss[j], params)
                w = float(alpha[k])
                jagg += (1 - w) * a + w * b
                if j not in inner:  # summed over the micro-batches, as the gradients
                    zero = torch.zeros_like(c)
                    rep = None if replicas is None else zero.clone()
                    cross = None if not cross_group else zero.clone()
                    inner[j] = InnerStep(
                        g,
                        j,
                        float(traj.sigmas[j]),
                        w,
                        float(paper[k]),
                        zero.clone(),
                        zero.clone(),
                        zero,
                        rep,
                        cross,
                    )
                inner[j].c += c
                inner[j].a += a
                inner[j].b += b
                if replicas is not None:
                    v_rep = replica_far_velocity(state, steps, k, vs[j], replicas)
                    inner[j].b_rep += _vjp(v_rep, ss[j], params)
                    del v_rep
                if cross_group:
                    inner[j].b_cross += _vjp(vs[steps[-1]], group_shift(ss[j], cross_group), params)
            del vs, ss
    return RolloutGradients(exact, jagg, [inner[j] for j in sorted(inner)])


def _cos(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(x @ y / (x.norm() * y.norm()).clamp_min(1e-300))


def _dot(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x.double() @ y.double())


ALPHA_SCALES = (0.0, 0.25, 0.5, 0.75, 1.0)  # the alpha_scale values whose estimators the study reports
GROUPS = 8  # rollouts are summed in this many interleaved groups (k mod 8): the jackknife's and halves' unit


class BiasAccumulator:
    """Sums over rollouts from which :meth:`summary` computes the module's figures, in two forms:

    - as the means' figures (``cos_expected``, ``rel_bias``: the means of K noisy rollouts, whose own noise
      biases them: a mean over few rollouts is mostly noise, so its cosine is low and its norm large);
    - unbiased (``*_u``): every ⟨E x, E y⟩ estimated by the U-statistic (⟨Σx_k, Σy_k⟩ − Σ⟨x_k, y_k⟩) / (K(K − 1)),
      which leaves each rollout's product with itself out, so noise adds nothing in expectation; with a
      jackknife standard error over :data:`GROUPS` interleaved groups of rollouts (``*_se``).

    It keeps per group the sums of g_exact, d = g_jagg − g_exact and, per inner step, u = b − a and w = c − a
    (float32, P each), and per rollout the scalars ⟨x_k, y_k⟩ the U-statistics leave out.
    """

    def __init__(self) -> None:
        self.k = 0
        self.keys: list[str] = []  # the vectors kept, in a fixed order: E, d, then per inner step u, w (, x)
        self.sums: dict[str, list[torch.Tensor | None]] = {}
        self.own: dict[tuple[str, str], list[list[float]]] = {}  # per group, the rollouts' ⟨x_k, y_k⟩
        self.steps: dict[str, dict[str, Any]] = {}
        self.batch_cos: list[float] = []

    def _add(self, key: str, x: torch.Tensor, g: int) -> None:
        sums = self.sums.setdefault(key, [None] * GROUPS)
        sums[g] = x.float().clone() if sums[g] is None else sums[g].add_(x.float())

    def _own(self, pair: tuple[str, str], value: float, g: int) -> None:
        self.own.setdefault(pair, [[] for _ in range(GROUPS)])[g].append(value)

    def add(self, r: RolloutGradients) -> None:
        g = self.k % GROUPS
        d = r.jagg - r.exact
        vecs = {"E": r.exact, "d": d}
        for s in r.inner:
            key = f"s{s.step}"
            row = {"group": s.group, "step": s.step, "t": s.t, "alpha": s.alpha, "alpha_paper": s.alpha_paper}
            self.steps.setdefault(key, row)
            vecs[f"{key}.u"], vecs[f"{key}.w"] = s.b - s.a, s.c - s.a
            if s.b_rep is not None:
                vecs[f"{key}.x"] = s.b - s.b_rep  # the far credit's coupling to the step's own noise
            if s.b_cross is not None:
                vecs[f"{key}.y"] = s.b - s.b_cross  # what the cross-fitted far credit leaves out
        if not self.keys:
            self.keys = list(vecs)
        elif list(vecs) != self.keys:
            raise ValueError(
                f"rollouts: every rollout needs the same inner steps, got {list(vecs)} after {self.keys}"
            )
        for key, x in vecs.items():
            self._add(key, x, g)
        for x, y in self._pairs():
            self._own((x, y), _dot(vecs[x], vecs[y]), g)
        self.batch_cos.append(_cos(r.jagg, r.exact))
        self.k += 1

    def _pairs(self) -> list[tuple[str, str]]:
        """Every pair of kept vectors (with itself): any linear combination's figures come from them."""
        return [(x, y) for i, x in enumerate(self.keys) for y in self.keys[i:]]

    # -- estimates over a set of groups (all of them, or all but one for the jackknife)
    def _total(self, key: str, groups: list[int]) -> torch.Tensor:
        return sum(self.sums[key][g].double() for g in groups if self.sums[key][g] is not None)

    def _own_values(self, x: str, y: str, groups: list[int]) -> list[float]:
        return [v for g in groups for v in self.own[(x, y)][g]]

    def _u(self, x: str, y: str, groups: list[int], totals: dict[str, torch.Tensor]) -> float:
        own = [v for g in groups for v in self.own[(x, y)][g]]
        n = len(own)
        return (float(totals[x] @ totals[y]) - sum(own)) / (n * (n - 1))

    def _estimators(
        self, u: dict[tuple[str, str], float], own: dict[tuple[str, str], float]
    ) -> dict[str, float]:
        """Per alpha_scale c of :data:`ALPHA_SCALES`, JAGG at c (its deviation from exact is
        d_c = Σ_j (c·α_j·u_j − w_j), α_j the paper's): rel_bias, bias_along and noise (tr Cov g_c / ‖E g_exact‖²);
        with replicas, the coupling part ‖E Σ_j c·α_j·x_j‖ / ‖E g_exact‖ and the bias of the replica estimator
        (the far credit at z̃_{W−1}: d_c − Σ_j c·α_j·x_j)."""

        def quad(a: dict[str, float], b: dict[str, float], table: dict[tuple[str, str], float]) -> float:
            return sum(
                ca * cb * (table[(x, y)] if (x, y) in table else table[(y, x)])
                for x, ca in a.items()
                for y, cb in b.items()
            )

        ee = u[("E", "E")]
        gg = own[("E", "E")]  # mean ‖g_exact‖² of one rollout: resolved at any K, unlike ‖E g‖²
        out: dict[str, float] = {}
        replicas = all(f"{key}.x" in self.keys for key in self.steps)
        cross = all(f"{key}.y" in self.keys for key in self.steps)
        for c in ALPHA_SCALES:
            d = {
                k: v
                for key, row in self.steps.items()
                for k, v in ((f"{key}.u", c * row["alpha_paper"]), (f"{key}.w", -1.0))
            }
            x = {f"{key}.x": c * row["alpha_paper"] for key, row in self.steps.items()} if replicas else {}
            g = {"E": 1.0, **d}
            dd, ed = quad(d, d, u), quad({"E": 1.0}, d, u)
            name = f"c{c:g}"
            out[f"{name}.rel_bias_u"] = math.sqrt(max(dd, 0.0) / ee) if ee > 0 else math.nan
            out[f"{name}.bias_along_u"] = ed / ee if ee > 0 else math.nan
            out[f"{name}.noise_u"] = (quad(g, g, own) - quad(g, g, u)) / ee if ee > 0 else math.nan
            # the squared bias in units of one rollout's ‖g_exact‖² (no ‖E g‖² in it, so it is resolved where
            # the signal is not; compare with signal_share_u, the same units for ‖E g_exact‖²)
            out[f"{name}.bias_share_u"] = dd / gg
            if replicas:
                xx, xd = quad(x, x, u), quad(x, d, u)
                out[f"{name}.coupling_u"] = math.sqrt(max(xx, 0.0) / ee) if ee > 0 else math.nan
                out[f"{name}.coupling_share_u"] = xx / gg
                rep = dd - 2 * xd + xx  # ‖E(d − x)‖²
                out[f"{name}.rel_bias_replica_u"] = math.sqrt(max(rep, 0.0) / ee) if ee > 0 else math.nan
            if cross:  # far credits at another sample's far state: d_c − Σ_j c·α_j·y_j
                y = {f"{key}.y": c * row["alpha_paper"] for key, row in self.steps.items()}
                yy, yd = quad(y, y, u), quad(y, d, u)
                xc = dd - 2 * yd + yy  # ‖E(d − y)‖²
                out[f"{name}.rel_bias_cross_u"] = math.sqrt(max(xc, 0.0) / ee) if ee > 0 else math.nan
                out[f"{name}.bias_share_cross_u"] = xc / gg
                out[f"{name}.bias_along_cross_u"] = (ed - quad({"E": 1.0}, y, u)) / ee if ee > 0 else math.nan
        return out

    def _figures(self, groups: list[int]) -> dict[str, float]:
        totals = {key: self._total(key, groups) for key in self.sums}
        u = {pair: self._u(*pair, groups, totals) for pair in self._pairs()}
        own = {pair: sum(v := self._own_values(*pair, groups)) / len(v) for pair in self._pairs()}
        ee, ed, dd = u[("E", "E")], u[("E", "d")], u[("d", "d")]
        jj, je = ee + 2 * ed + dd, ee + ed  # J = E + d
        out = {
            "cos_expected_u": je / math.sqrt(jj * ee) if jj > 0 and ee > 0 else math.nan,
            "rel_bias_u": math.sqrt(max(dd, 0.0) / ee) if ee > 0 else math.nan,
            "bias_along_u": ed / ee if ee > 0 else math.nan,
            # ‖E g‖² over the mean ‖g_k‖²: the share of one rollout's gradient that is signal; resolving the
            # expected gradient takes K of several times its inverse
            "signal_share_u": ee * len(own_ee) / sum(own_ee)
            if (own_ee := self._own_values("E", "E", groups))
            else math.nan,
        }
        for key, row in self.steps.items():
            uu, uw, ww = u[(f"{key}.u", f"{key}.u")], u[(f"{key}.u", f"{key}.w")], u[(f"{key}.w", f"{key}.w")]
            a = row["alpha"]
            best = uw / uu if uu > 0 else math.nan
            err2 = a * a * uu - 2 * a * uw + ww  # ‖E[α·u − w]‖², e_j = α·u − w
            best2 = ww - uw * uw / uu if uu > 0 else math.nan
            along = a * u[("E", f"{key}.u")] - u[("E", f"{key}.w")]
            out[f"{key}.credit_error_u"] = math.sqrt(max(err2, 0.0) / ee) if ee > 0 else math.nan
            out[f"{key}.credit_along_u"] = along / ee if ee > 0 else math.nan
            out[f"{key}.alpha_best_u"] = best
            out[f"{key}.credit_error_best_u"] = math.sqrt(max(best2, 0.0) / ee) if ee > 0 else math.nan
            if f"{key}.x" in self.keys:  # the best α of the far credit taken at the replica: u − x
                x = f"{key}.x"
                rr = uu - 2 * u[(f"{key}.u", x)] + u[(x, x)]
                rw = uw - u[(x, f"{key}.w") if (x, f"{key}.w") in u else (f"{key}.w", x)]
                out[f"{key}.alpha_best_replica_u"] = rw / rr if rr > 0 else math.nan
        out.update(self._estimators(u, own))
        return out

    def summary(self) -> dict[str, Any]:
        """The figures of the module docstring over the rollouts added so far (at least 2; the standard errors
        need one in each of the :data:`GROUPS` groups)."""
        if self.k < 2:
            raise ValueError(f"rollouts: the bias needs at least 2 rollouts, got {self.k}")
        K, every = self.k, list(range(GROUPS))
        mean = {key: self._total(key, every) / K for key in self.sums}
        g, d = mean["E"], mean["d"]
        gn = float(g.norm()) or math.inf
        halves = [self._total("E", every[0::2]) / ((K + 1) // 2), self._total("E", every[1::2]) / (K // 2)]
        whole = self._figures(every)
        # jackknife over the groups: SE² = (G − 1)/G · Σ (θ_−g − θ̄)²
        se: dict[str, float] = {}
        if K >= 2 * GROUPS:
            leave = [self._figures([h for h in every if h != g]) for g in every]
            for key in whole:
                vals = [x[key] for x in leave]
                m = sum(vals) / GROUPS
                se[key] = math.sqrt((GROUPS - 1) / GROUPS * sum((v - m) ** 2 for v in vals))
        nan = math.nan
        steps = []
        for key, row in sorted(self.steps.items(), key=lambda kv: kv[1]["step"]):
            u, w, a = mean[f"{key}.u"], mean[f"{key}.w"], row["alpha"]
            err, best = a * u - w, float(u @ w / (u @ u).clamp_min(1e-300))
            steps.append(
                {
                    **row,
                    "credit_error": float(err.norm()) / gn,
                    "credit_along": float(err @ g) / gn**2,
                    "alpha_best": best,
                    "credit_error_best": float((best * u - w).norm()) / gn,
                    **{
                        name: whole[f"{key}.{name}"]
                        for name in (
                            "credit_error_u",
                            "credit_along_u",
                            "alpha_best_u",
                            "credit_error_best_u",
                        )
                    },
                    **{
                        f"{name}_se": se.get(f"{key}.{name}", nan)
                        for name in ("credit_error_u", "credit_along_u", "alpha_best_u")
                    },
                    **{
                        name: whole.get(f"{key}.{name}", nan)
                        if suffix == ""
                        else se.get(f"{key}.{name[:-3]}", nan)
                        for name, suffix in (("alpha_best_replica_u", ""), ("alpha_best_replica_u_se", "se"))
                    },
                }
            )
        estimators = []
        for c in ALPHA_SCALES:
            row: dict[str, Any] = {"alpha_scale": c}
            for name in (
                "rel_bias_u",
                "bias_along_u",
                "noise_u",
                "bias_share_u",
                "coupling_u",
                "coupling_share_u",
                "rel_bias_replica_u",
                "rel_bias_cross_u",
                "bias_share_cross_u",
                "bias_along_cross_u",
            ):
                key = f"c{c:g}.{name}"
                if key in whole:
                    row[name], row[f"{name}_se"] = whole[key], se.get(key, nan)
            estimators.append(row)
        return {
            "rollouts": K,
            "cos_expected": _cos(g + d, g),
            "rel_bias": float(d.norm()) / gn,
            "bias_along": float(d @ g) / gn**2,
            "noise_floor": {
                "cos": _cos(halves[0], halves[1]),
                "rel": float((halves[0] - halves[1]).norm()) / gn,
            },
            "cos_expected_u": whole["cos_expected_u"],
            "cos_expected_u_se": se.get("cos_expected_u", nan),
            "rel_bias_u": whole["rel_bias_u"],
            "rel_bias_u_se": se.get("rel_bias_u", nan),
            "bias_along_u": whole["bias_along_u"],
            "bias_along_u_se": se.get("bias_along_u", nan),
            "signal_share_u": whole["signal_share_u"],
            "signal_share_u_se": se.get("signal_share_u", nan),
            "per_batch_cos_mean": sum(self.batch_cos) / K,
            "per_batch_cos_min": min(self.batch_cos),
            "inner_steps": steps,
            "estimators": estimators,
        }


class LiveBias:
    """The bias of a run, live, from its gradient probes (``probe_every``): each probe gives one rollout's
    (g_exact, g_jagg) on the probed samples, and the product of one probe's vector with the PREVIOUS probe's
    (another rollout, independent noise) is unbiased for the product of their expectations — the U-statistic
    of :class:`BiasAccumulator` over neighbouring pairs, which keeps two vectors instead of K. Those products are
    averaged with an exponential weight (``halflife`` probes, debiased as Adam's moments) and give:

        bias/rel_live      ‖E d‖ / ‖E g_exact‖           (d = g_jagg − g_exact)
        bias/along_live    ⟨E d, E g_exact⟩ / ‖E g_exact‖²  (negative: the bias shrinks the signal)

    NaN until two probes, and where the averaged ‖E g_exact‖² is not yet positive (noise). The parameters move
    between probes, so this follows a slowly changing expectation; `jagg study bias` measures one checkpoint.
    """

    def __init__(self, halflife: float = 5.0) -> None:
        self.beta = 0.5 ** (1.0 / halflife)
        self.prev: tuple[torch.Tensor, torch.Tensor] | None = None
        self.moments = {"ee": 0.0, "ed": 0.0, "dd": 0.0}
        self.n = 0

    def update(self, exact: torch.Tensor, jagg: torch.Tensor) -> dict[str, float]:
        """Add one probe's whole-update gradients (P,); the metrics after it."""
        exact, d = exact.double(), (jagg - exact).double()
        if self.prev is not None:
            e0, d0 = self.prev
            pairs = {"ee": float(exact @ e0), "ed": 0.5 * float(exact @ d0 + d @ e0), "dd": float(d @ d0)}
            for key, value in pairs.items():
                self.moments[key] = self.beta * self.moments[key] + (1 - self.beta) * value
            self.n += 1
        self.prev = (exact.clone(), d.clone())
        if self.n == 0:
            return {"bias/rel_live": math.nan, "bias/along_live": math.nan}
        scale = 1 - self.beta**self.n  # Adam's debiasing of a zero-started average
        ee, ed, dd = (self.moments[k] / scale for k in ("ee", "ed", "dd"))
        if ee <= 0:
            return {"bias/rel_live": math.nan, "bias/along_live": math.nan}
        return {"bias/rel_live": math.sqrt(max(dd, 0.0) / ee), "bias/along_live": ed / ee}
