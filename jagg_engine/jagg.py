"""JAGG — Jacobian-Aggregated Group Gradient — and the policy update that the trainer calls.

Notation (PAPER.md, "Algorithm for one group of W consecutive timesteps"):
    W                 window: number of consecutive trained steps in a group, t_0 > … > t_{W−1}
    v̂_j               velocity prediction at group step j, (B, *S)
    L_j               per-step loss: PPO-clipped objective through the SDE step's log-prob (+ β·KL), scaled
                      by 1/K where K is the number of trained steps of the rollout
    s_j = ∂L_j/∂v̂_j   upstream gradient of step j, (B, *S), obtained through a detached proxy of v̂_j
    α_j               (t_0 − t_j) / (t_0 − t_{W−1})
    s_base, s_corr    Σ_j (1 − α_j)·s_j  and  Σ_j α_j·s_j
    J_j               ∂v̂_j/∂θ; the exact group gradient is G = Σ_j J_jᵀ s_j ≈ J_0ᵀ s_base + J_{W−1}ᵀ s_corr

Strategies of one group (all accumulate into ``.grad`` of the model's parameters):
    exact     per step: forward with grad, backward of L_j            → W forwards with grad, W backwards
    jagg      (a) both endpoints in ONE batched grad forward, the W−2 inner steps under no_grad;
              (b) s_j for all j; (c) α_j, s_base, s_corr; (d) ONE torch.autograd.backward over both endpoints
              → 1 forward with grad (2B), W−2 no-grad forwards, 1 backward
              ``endpoint_backward="sequential"``: endpoint 0 forward+backward with s_base, then endpoint W−1
              with s_corr (s_base does not involve s_{W−1}, nor s_corr s_0, since α_0 = 0 and α_{W−1} = 1),
              the same gradient with half the activation memory, at the price of two backward calls.
    pair      the unbiased estimator at JAGG's cost: each sample trains one step drawn from each half of the
              group, weighted by the half's size (:func:`jagg_engine.credit.pair_draw`; ``policy_update``'s
              ``generator`` draws) → 1 forward with grad (2B rows), 1 backward; equal to exact in expectation
    endpoint  the paper's ablation: G_end = J_0ᵀ s_0 + J_{W−1}ᵀ s_{W−1}, i.e. the loss of the two endpoint
              steps alone (each still scaled by 1/K), the inner steps neither forwarded nor counted
              → 1 forward with grad (2B), 1 backward
A group of one step is always exact; a group of two is the same gradient under every strategy.

Where the far endpoint's weight goes (``alpha_scale``, ``far_credit``) and the control variate (``cv_frac``):
see :mod:`jagg_engine.credit`, which holds that arithmetic.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from .backbones.base import VelocityFn, cat_cond, index_cond
from .cost import route_groups
from .credit import (
    aggregate_upstream,
    control_variate_count,
    control_variate_draw,
    control_variate_upstream,
    far_upstream,
    group_shift,
    jagg_alpha,
    pair_draw,
    pair_mix,
    pair_upstream,
    pair_weights,
)
from .grpo import PPOStats, ppo_clip_loss, step_kl
from .sde import SamplerConfig, Trajectory, compute_dtype, same_policy
from .update_config import UpdateConfig as UpdateConfig  # the settings; importers read them from here too

# ----------------------------------------------------------------------------------------------------------
# The per-step objective and its upstream gradient


@dataclass
class UpdateCounts:
    forward_grad: int = 0  # model calls with grad enabled (a batched endpoint call counts once)
    forward_nograd: int = 0  # model calls under no_grad
    backward: int = 0  # torch.autograd.backward calls through the model
    ref_forward: int = 0  # reference-policy calls (β > 0)
    reused: int = 0  # inner-step velocities taken from the rollout instead of a forward
    cv_pairs: int = 0  # (sample, inner step) pairs given the control variate's exact − JAGG correction


@dataclass
class UpdateResult:
    """What one policy update did: objective value and PPO metrics averaged over computed steps, counts, times."""

    loss: float = 0.0
    approx_kl: float = 0.0
    clipfrac: float = 0.0
    ratio_mean: float = 0.0
    kl: float = 0.0
    steps_computed: int = 0
    counts: UpdateCounts = field(default_factory=UpdateCounts)
    time_forward: float = 0.0
    time_backward: float = 0.0
    time_total: float = 0.0
    group_kinds: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics for the run store."""
        return {
            "loss/policy": self.loss,
            "loss/approx_kl": self.approx_kl,
            "loss/clipfrac": self.clipfrac,
            "loss/ratio_mean": self.ratio_mean,
            "loss/kl_ref": self.kl,
            "time/update_forward": self.time_forward,
            "time/update_backward": self.time_backward,
            "time/update": self.time_total,
            "count/forward_grad": float(self.counts.forward_grad),
            "count/forward_nograd": float(self.counts.forward_nograd),
            "count/backward": float(self.counts.backward),
            "count/ref_forward": float(self.counts.ref_forward),
            "count/reused": float(self.counts.reused),
            "count/cv_pairs": float(self.counts.cv_pairs),
        }


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


class UpdateState:
    """State shared by the group routines of one policy update: the rollout, the objective and the book-keeping.

    A group routine (:data:`GroupRoutine`) composes its calls: ``forward`` (model calls, counted and timed),
    ``upstream`` (s_j of phase 2), ``step_loss`` (L_j / K), ``backward`` (counted and timed) and
    ``inner_velocity``; the engine's own routines are ``exact_group``, ``jagg_group`` and ``endpoint_group``.
    ``generator`` feeds the control variate's draws (``update.cv_frac`` > 0): one draw per inner step of each
    JAGG group, over the whole batch, in the order the groups are first computed.
    """

    def __init__(
        self,
        model: VelocityFn,
        traj: Trajectory,
        advantages: torch.Tensor,
        update: UpdateConfig,
        sampler: SamplerConfig,
        ref_model: VelocityFn | None,
        rollout_policy: bool = True,
        generator: torch.Generator | None = None,
    ):
        if update.cv_frac > 0 and generator is None:
            raise ValueError(
                "cv_frac: a control variate needs a generator for its draws (policy_update's generator)"
            )
        if update.strategy == "pair" and generator is None:
            raise ValueError("strategy: pair draws its steps from a generator (policy_update's generator)")
        self.rollout_policy, self.generator = rollout_policy, generator
        self._draws: dict[
            int, torch.Tensor
        ] = {}  # group's first step → per inner step, the drawn samples of the whole batch (m,)
        self._pairs: dict[int, torch.Tensor] = {}  # strategy pair: group's first step → (B, 2) drawn offsets
        self._pair_jagg: dict[
            int, torch.Tensor
        ] = {}  # pair_frac < 1: group's first step → (B,) JAGG's samples
        self.model, self.traj, self.update, self.sampler, self.ref_model = (
            model,
            traj,
            update,
            sampler,
            ref_model,
        )
        self.K = len(traj.sde_steps)  # number of trained steps: L = (1/K) Σ_j L_j
        self.full_traj, self.full_advantages = traj, advantages
        self.result = UpdateResult()
        self._sums = torch.zeros(5, dtype=torch.float64)
        # Σ over computed (step, micro-batch) of b_m / B: the number of whole steps computed
        self._weight = 0.0
        # whether inner steps take the rollout's velocities: decided at the first one (the guard runs a forward)
        self._reuse: bool | None = None
        self.use_samples(slice(0, traj.batch_size))

    def use_samples(self, index: slice) -> None:
        """Compute on the samples ``index`` of the rollout from now on (one micro-batch); their losses are
        weighted by b_m / B so that the micro-batches' gradients sum to the whole batch's."""
        whole = index == slice(0, self.full_traj.batch_size)
        self.index = index
        self.traj = self.full_traj if whole else self.full_traj.select(index)
        self.advantages = self.full_advantages if whole else self.full_advantages[index]
        self.B = self.traj.batch_size
        self.scale = 1.0 if whole else self.B / self.full_traj.batch_size  # b_m / B

    def micro_batches(self) -> list[slice]:
        """The slices of the update's micro-batches (one slice, the whole batch, when micro_batch is None)."""
        B = self.full_traj.batch_size
        b = self.update.micro_batch or B
        return [slice(i, min(i + b, B)) for i in range(0, B, b)]

    # -- model calls, counted and timed
    def t(self, j: int) -> torch.Tensor:
        return self.traj.sigmas[j].expand(self.B)  # (B,)

    def forward(
        self, steps: list[int], grad: bool, rows: list[torch.Tensor | None] | None = None
    ) -> torch.Tensor:
        """One model call on the latents of ``steps`` batched together, each step on all B samples or, where
        ``rows`` gives an index tensor for it, on those samples only. Returns (Σ_steps rows, *S)."""
        rows = rows or [None] * len(steps)
        z = torch.cat(
            [self.traj.latents[j] if r is None else self.traj.latents[j][r] for j, r in zip(steps, rows)]
        )
        t = torch.cat([self.t(j) if r is None else self.t(j)[r] for j, r in zip(steps, rows)])  # (n,)
        conds = [self.traj.cond if r is None else index_cond(self.traj.cond, r) for r in rows]
        cond = conds[0] if len(steps) == 1 else cat_cond(conds)
        _sync(z)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(grad):
            v = self.model(z, t, cond)
        _sync(z)
        self.result.time_forward += time.perf_counter() - t0
        if grad:
            self.result.counts.forward_grad += 1
        else:
            self.result.counts.forward_nograd += 1
        return v

    def backward(self, outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        _sync(outputs[0])
        t0 = time.perf_counter()
        torch.autograd.backward(outputs, [g.to(o.dtype) for o, g in zip(outputs, grads)])
        _sync(outputs[0])
        self.result.time_backward += time.perf_counter() - t0
        self.result.counts.backward += 1

    @property
    def reuse(self) -> bool:
        if self._reuse is None:
            self._reuse = (
                self.update.reuse_rollout_velocity == "auto"
                and self.rollout_policy
                and can_reuse_velocities(self.model, self.full_traj)
            )
        return self._reuse

    def inner_velocity(self, j: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """v̂_j of the samples ``rows`` (None: all B): the rollout's when reuse holds, else a no-grad forward."""
        if self.reuse and j in self.traj.velocity_steps:
            self.result.counts.reused += 1
            v = self.traj.velocity(j)
            return v if rows is None else v[rows]
        return self.forward([j], grad=False, rows=[rows])

    def drawn(self, steps: list[int]) -> list[torch.Tensor] | None:
        """The control variate's drawn samples of each inner step of group ``steps`` in the current micro-batch
        (indices into it), or None without a control variate. Drawn once per group over the whole batch."""
        if self.update.cv_frac <= 0 or len(steps) < 3:
            return None
        if steps[0] not in self._draws:
            B, p = self.full_traj.batch_size, self.update.cv_frac
            self._draws[steps[0]] = [control_variate_draw(B, p, self.generator) for _ in steps[1:-1]]
        lo, hi = self.index.start, self.index.stop
        device = self.traj.latents.device
        return [(rows[(rows >= lo) & (rows < hi)] - lo).to(device) for rows in self._draws[steps[0]]]

    def pair_rows(self, steps: list[int]) -> list[torch.Tensor]:
        """Strategy pair: for each step of group ``steps``, the samples of the current micro-batch that train it
        (indices into it). Drawn once per group over the whole batch (:func:`pair_draw`)."""
        if steps[0] not in self._pairs:
            choice = pair_draw(self.full_traj.batch_size, len(steps), self.generator)
            if self.update.pair_frac < 1:
                self._pair_jagg[steps[0]] = pair_mix(
                    choice, len(steps), self.update.pair_frac, self.generator
                )
            self._pairs[steps[0]] = choice
        choice = self._pairs[steps[0]][self.index]  # (b, 2)
        device = self.traj.latents.device
        return [torch.nonzero((choice == k).any(dim=1)).flatten().to(device) for k in range(len(steps))]

    @property
    def cv_weight(self) -> float:
        """w = B / m: the inverse of a pair's probability of being drawn."""
        B = self.full_traj.batch_size
        return B / control_variate_count(B, self.update.cv_frac)

    # -- the objective
    def step_loss(
        self, v: torch.Tensor, j: int, rows: torch.Tensor | None = None, weight: float = 1.0
    ) -> torch.Tensor:
        """L_j / K: PPO-clipped loss of step j through the SDE log-prob of the stored z_{j+1} (+ β·KL).

        ``rows`` (strategy pair): ``v`` holds those samples of the micro-batch only; their per-sample losses
        enter as in the whole batch's mean, multiplied by ``weight``."""
        traj, adv = self.traj, self.advantages
        z, z_next, old, t, cond = (
            traj.latents[j],
            traj.latents[j + 1],
            traj.log_probs[j],
            self.t(j),
            traj.cond,
        )
        if rows is not None:
            z, z_next, old, adv, t = z[rows], z_next[rows], old[rows], adv[rows], t[rows]
            cond = index_cond(cond, rows)
        out = self.sampler.step(v, z, j, traj.sigmas, prev_sample=z_next)
        loss, stats = ppo_clip_loss(out.log_prob, old, adv, self.update.clip_range)
        kl = loss.new_zeros(())
        if self.update.beta > 0:
            with torch.no_grad():
                v_ref = self.ref_model(z, t, cond)
                self.result.counts.ref_forward += 1
            ref = self.sampler.step(v_ref, z, j, traj.sigmas, prev_sample=z_next)
            h = self.sampler.kl_step_size(j, traj.sigmas)
            kl = step_kl(out.mean, ref.mean, out.std, self.update.kl_form, h).mean()
            loss = loss + self.update.beta * kl
        share = 1.0 if rows is None else weight * len(rows) / self.B
        self._record(stats, loss, kl, share)
        if rows is not None:
            return loss * (self.scale * share / self.K)
        return loss * self.scale / self.K if self.scale != 1.0 else loss / self.K

    def _record(self, stats: PPOStats, loss: torch.Tensor, kl: torch.Tensor, share: float = 1.0) -> None:
        """Batch means of one step on one micro-batch, weighted b_m / B: summed over micro-batches they are
        the whole batch's means. ``share``: the part of the micro-batch they stand for (strategy pair: the drawn
        samples' count times their weight, over b_m)."""
        vals = [loss.detach(), stats.approx_kl, stats.clipfrac, stats.ratio_mean, kl.detach()]
        self._sums += self.scale * share * torch.stack([x.double().cpu() for x in vals])
        self._weight += self.scale * share

    def upstream(self, v: torch.Tensor, j: int) -> torch.Tensor:
        """Phase 2: s_j = ∂L_j/∂v̂_j through a detached proxy — autograd only through the SDE step and PPO."""
        proxy = v.detach().to(compute_dtype(v.dtype)).requires_grad_(True)
        with torch.enable_grad():
            (s,) = torch.autograd.grad(self.step_loss(proxy, j), proxy)
        return s  # (B, *S)

    def finish(self) -> UpdateResult:
        r = self.result
        r.steps_computed = round(self._weight)
        n = self._weight or 1.0
        loss, akl, cf, rm, kl = (self._sums / n).tolist()
        r.loss, r.approx_kl, r.clipfrac, r.ratio_mean, r.kl = loss * n / self.K, akl, cf, rm, kl
        return r

    # -- group routines
    def exact_group(self, steps: list[int]) -> None:
        for j in steps:
            v = self.forward([j], grad=True)
            loss = self.step_loss(v, j)
            self.backward([loss], [torch.ones_like(loss)])

    def jagg_group(self, steps: list[int], sequential: bool) -> None:
        first, last, inner = steps[0], steps[-1], steps[1:-1]
        alpha = jagg_alpha(self.traj.sigmas[steps], self.update.alpha_scale)  # (W,)
        drawn = self.drawn(steps)
        if drawn is not None and any(len(rows) for rows in drawn):
            self.control_variate_group(steps, alpha, drawn, sequential)
            return
        # Phases 1–2 for the inner steps: no-grad forwards (or the rollout's own v̂_j), upstream gradients.
        s_inner = [self.upstream(self.inner_velocity(j), j) for j in inner]  # W−2 × (B, *S)
        a_inner = alpha[1:-1]
        cross = self.update.group_size if self.update.far_credit == "cross" else None
        if sequential:
            # s_base = s_0 + Σ_inner (1 − α_j) s_j, s_corr = Σ_inner α_j s_j + s_{W−1}  (α_0 = 0, α_{W−1} = 1)
            far = [s_j if cross is None else group_shift(s_j, cross) for s_j in s_inner]
            for j, weights, credits in ((first, 1 - a_inner, s_inner), (last, a_inner, far)):
                v = self.forward([j], grad=True)
                s = self.upstream(v, j)
                for w, s_j in zip(weights, credits):
                    s = s + w * s_j
                self.backward([v], [s])
            return
        v_ends = self.forward([first, last], grad=True)  # (2B, *S): phase 1, ONE batched grad forward
        v_first, v_last = v_ends[: self.B], v_ends[self.B :]
        s_all = torch.stack(
            [self.upstream(v_first, first), *s_inner, self.upstream(v_last, last)]
        )  # (W, B, *S)
        s_base, s_corr = aggregate_upstream(s_all, alpha)  # phase 3
        if cross is not None:
            s_corr = far_upstream(s_all, alpha, cross)
        self.backward([v_first, v_last], [s_base, s_corr])  # phase 4: ONE joint backward

    def control_variate_group(
        self, steps: list[int], alpha: torch.Tensor, drawn: list[torch.Tensor], sequential: bool
    ) -> None:
        """A JAGG group with the control variate's correction on the ``drawn`` samples of each inner step
        (module docstring): one grad forward of both endpoints (every sample) and of each inner step on its
        drawn samples, one backward."""
        first, last, inner = steps[0], steps[-1], steps[1:-1]
        B, w = self.B, self.cv_weight
        self.result.counts.cv_pairs += sum(len(rows) for rows in drawn)
        # Phase 1: the drawn pairs with grad (and the endpoints, unless sequential)
        ends = [] if sequential else [first, last]
        pairs = [(j, rows) for j, rows in zip(inner, drawn) if len(rows)]
        v = self.forward(
            [*ends, *(j for j, _ in pairs)], grad=True, rows=[None] * len(ends) + [r for _, r in pairs]
        )
        v_drawn, at = {}, len(ends) * B
        for j, rows in pairs:
            v_drawn[j], at = v[at : at + len(rows)], at + len(rows)  # (m_j, *S)
        # Phase 2: s_j of every sample; the inner v̂_j of the samples not drawn reused or forwarded without grad
        s_inner = []
        for j, rows in zip(inner, drawn):
            rest = torch.ones(B, dtype=torch.bool, device=rows.device)
            rest[rows] = False
            rest = rest.nonzero().squeeze(1)  # (B − m_j,)
            v_rest = self.inner_velocity(j, rest) if len(rest) else None
            if not len(rows):
                v_j = v_rest
            else:
                v_j = v_drawn[j].detach()
                v_j = v_j.new_empty((B, *v_j.shape[1:])).index_copy(0, rows, v_j)
                if v_rest is not None:
                    v_j = v_j.index_copy(0, rest, v_rest.to(v_j.dtype))
            s_inner.append(self.upstream(v_j, j))
        outs_in = [v_drawn[j] for j, _ in pairs]  # the inner outputs of the backward, with their upstreams:
        drawn_only = lambda s_in: [g for g, rows in zip(s_in, drawn) if len(rows)]  # noqa: E731
        if sequential:  # endpoint 0, then endpoint W − 1 with the drawn inner steps: two backwards
            v_first = self.forward([first], grad=True)
            s_all = torch.stack([self.upstream(v_first, first), *s_inner, torch.zeros_like(s_inner[0])])
            s_first, _, _ = control_variate_upstream(s_all, alpha, drawn, w)  # s_first does not read s_{W−1}
            self.backward([v_first], [s_first])
            v_last = self.forward([last], grad=True)
            s_all[-1] = self.upstream(v_last, last)
            _, s_last, s_in = control_variate_upstream(s_all, alpha, drawn, w)
            self.backward([v_last, *outs_in], [s_last, *drawn_only(s_in)])
            return
        v_first, v_last = v[:B], v[B : 2 * B]
        s_all = torch.stack(
            [self.upstream(v_first, first), *s_inner, self.upstream(v_last, last)]
        )  # (W, B, *S)
        s_first, s_last, s_in = control_variate_upstream(s_all, alpha, drawn, w)  # phase 3
        self.backward(
            [v_first, v_last, *outs_in], [s_first, s_last, *drawn_only(s_in)]
        )  # phase 4: ONE backward

    def endpoint_group(self, steps: list[int]) -> None:
        first, last = steps[0], steps[-1]
        v_ends = self.forward([first, last], grad=True)  # (2B, *S)
        loss = self.step_loss(v_ends[: self.B], first) + self.step_loss(v_ends[self.B :], last)
        self.backward([loss], [torch.ones_like(loss)])

    def pair_group(self, steps: list[int]) -> None:
        """Strategy pair: each sample's two drawn steps (:meth:`pair_rows`) in ONE grad forward and ONE backward,
        their losses weighted by their halves' sizes; with ``pair_cv`` λ > 0 through upstreams that also carry
        λ·(the other half's credits − the other drawn step's weighted credit) (:func:`pair_upstream`)."""
        weights = pair_weights(len(steps)).tolist()
        rows = self.pair_rows(steps)
        picked = [(j, r, w) for j, r, w in zip(steps, rows, weights) if len(r)]
        v = self.forward([j for j, _, _ in picked], grad=True, rows=[r for _, r, _ in picked])
        if self.update.pair_cv > 0 or self.update.pair_frac < 1:
            self.pair_cv_backward(steps, picked, v)
            return
        loss, at = v.new_zeros((), dtype=compute_dtype(v.dtype)), 0
        for j, r, w in picked:
            loss = loss + self.step_loss(v[at : at + len(r)], j, rows=r, weight=w)
            at += len(r)
        self.backward([loss], [torch.ones_like(loss)])

    def pair_cv_backward(
        self, steps: list[int], picked: list[tuple[int, torch.Tensor, float]], v: torch.Tensor
    ) -> None:
        """The backward of a pair group with its control variate: every step's credit s_j on every sample (the
        drawn rows' from the grad forward ``v``, the others' from the rollout's velocities or, where reuse does
        not hold, ONE no-grad forward of those rows of every step together: (W − 2)·B rows, JAGG's), then
        :func:`pair_upstream` at the drawn rows."""
        index = {j: k for k, j in enumerate(steps)}
        drawn_at, at = {}, 0
        for j, r, _ in picked:  # the grad forward's rows, in order
            drawn_at[j] = (r, v[at : at + len(r)])
            at += len(r)
        device = self.traj.latents.device
        v_all = {j: torch.empty_like(self.traj.latents[j], dtype=v.dtype) for j in steps}
        rest: dict[int, torch.Tensor] = {}
        for j in steps:
            r, v_drawn = drawn_at.get(j, (None, None))
            others = torch.ones(self.B, dtype=torch.bool, device=device)
            if r is not None:
                others[r] = False
                v_all[j][r] = v_drawn.detach()
            if others.any():
                rest[j] = torch.nonzero(others).flatten()
        reused = [j for j in rest if self.reuse and j in self.traj.velocity_steps]
        for j in reused:
            v_all[j][rest[j]] = self.inner_velocity(j, rest[j]).to(v.dtype)
        todo = [j for j in rest if j not in reused]
        if todo:
            out, at = self.forward(todo, grad=False, rows=[rest[j] for j in todo]), 0
            for j in todo:
                v_all[j][rest[j]] = out[at : at + len(rest[j])].to(v.dtype)
                at += len(rest[j])
        s_all = [self.upstream(v_all[j], j) for j in steps]
        s = torch.stack(s_all)  # (W, B, *S)
        choice = self._pairs[steps[0]][self.index].to(s.device)  # (b, 2)
        jagg = self._pair_jagg[steps[0]][self.index] if steps[0] in self._pair_jagg else None
        alpha = jagg_alpha(self.traj.sigmas[steps]) if jagg is not None else None
        u_first, u_second = pair_upstream(s, choice, self.update.pair_cv, jagg, alpha)
        grads = [u_first[r] if index[j] < len(steps) // 2 else u_second[r] for j, r, _ in picked]
        self.backward([v], [torch.cat(grads)])

    def run_group(self, steps: list[int], kind: str) -> None:
        if len(steps) == 1 or kind == "exact":
            self.exact_group(steps)
        elif kind == "pair":
            self.pair_group(steps)
        elif kind == "jagg":
            self.jagg_group(steps, sequential=self.update.endpoint_backward == "sequential")
        else:
            self.endpoint_group(steps)


def can_reuse_velocities(model: VelocityFn, traj: Trajectory) -> bool:
    """Whether the rollout's stored v̂_j are the current policy's: stored in the compute dtype, and ``model``
    is the policy that sampled — the same object with every parameter and buffer at the in-place version and
    holding the bits it had then, the same modes, adapter states and scalar settings, and no forward that draws
    random numbers (dropout) then or now (:func:`jagg_engine.sde.same_policy`). The second check of reuse, after
    the caller's ``rollout_policy``.
    """
    if traj.velocities is None or traj.velocities.dtype != compute_dtype(traj.velocities.dtype):
        return False
    z, t = traj.latents[0], traj.sigmas[0].expand(traj.batch_size)
    return same_policy(traj.policy, model, z, t, traj.cond)


GroupRoutine = Callable[[UpdateState, list[int]], None]
"""``routine(state, steps)``: accumulate the gradient of the group ``steps`` through ``state``'s calls."""


def group_plan(traj_steps: list[int], update: UpdateConfig) -> list[tuple[list[int], str]]:
    """The groups of a rollout and the strategy each one uses after jagg_frac routing
    (:func:`jagg_engine.cost.route_groups`, which the cost model counts)."""
    return route_groups(traj_steps, update.strategy, update.window, update.jagg_frac)


def reuse_steps(traj_steps: list[int], update: UpdateConfig) -> list[int]:
    """The grid steps whose rollout velocities the update can read: the inner steps of the groups routed to
    JAGG, every step of the groups routed to pair with its control variate (a rollout need keep no other).
    Empty unless reuse is on and the strategy is jagg, or pair with ``pair_cv`` > 0 or ``pair_frac`` < 1."""
    pair = update.strategy == "pair" and (update.pair_cv > 0 or update.pair_frac < 1)
    if update.reuse_rollout_velocity != "auto" or not (update.strategy == "jagg" or pair):
        return []
    plan = group_plan(traj_steps, update)
    if pair:
        return [j for steps, kind in plan if kind == "pair" and len(steps) > 2 for j in steps]
    return [j for steps, kind in plan if kind == "jagg" and len(steps) > 2 for j in steps[1:-1]]


def policy_update(
    model: VelocityFn,
    traj: Trajectory,
    advantages: torch.Tensor,
    update: UpdateConfig,
    sampler: SamplerConfig,
    ref_model: VelocityFn | None = None,
    routines: Mapping[str, GroupRoutine] | None = None,
    rollout_policy: bool = True,
    generator: torch.Generator | None = None,
) -> UpdateResult:
    """Accumulate the policy gradient of one rollout batch into ``.grad`` (the caller zeroes and steps).

    The objective is L = (1/K) Σ_{j ∈ trained steps} L_j with L_j the batch-mean PPO-clipped loss of step j
    (+ β·KL to ``ref_model``). Each group of W trained steps is computed by the strategy its routing gives
    (module docstring), on micro-batches of ``update.micro_batch`` samples whose gradients add up to the
    whole batch's. Shapes: advantages (B,), traj as produced by :func:`jagg_engine.sde.rollout`.
    ``routines``: strategy → :data:`GroupRoutine` run instead of the engine's own on the groups of more than
    one step routed to that strategy (another schedule of the same gradient, e.g. `jagg bench`'s paper-code).
    ``rollout_policy``: the caller's word that no optimizer step, weight load or other parameter write
    happened since ``traj`` was sampled; False forbids velocity reuse whatever the guard says (the trainer
    passes True only for the first mini-batch of a rollout, before any such write).
    ``generator``: the control variate's draws (needed when ``update.cv_frac`` > 0; the trainer passes the
    "control_variate" stream of its step and rank).
    """
    if update.beta > 0 and ref_model is None:
        raise ValueError("beta: a reference model is needed when beta > 0")
    t0 = time.perf_counter()
    state = UpdateState(model, traj, advantages, update, sampler, ref_model, rollout_policy, generator)
    plan = group_plan(traj.sde_steps, update)
    for index in state.micro_batches():  # (b_m samples each; the loss of each is weighted b_m / B)
        state.use_samples(index)
        for steps, kind in plan:
            routine = (routines or {}).get(kind) if len(steps) > 1 else None
            if routine is not None:
                routine(state, steps)
            else:
                state.run_group(steps, kind)
    state.result.group_kinds = [kind if len(steps) > 1 else "exact" for steps, kind in plan]
    result = state.finish()
    result.time_total = time.perf_counter() - t0
    return result


def run_single_group(
    model: VelocityFn,
    traj: Trajectory,
    advantages: torch.Tensor,
    update: UpdateConfig,
    sampler: SamplerConfig,
    steps: list[int],
    kind: str,
    ref_model: VelocityFn | None = None,
) -> UpdateResult:
    """Accumulate the gradient of ONE group under strategy ``kind`` — the same routine the update uses.

    Used by the gradient-fidelity probe to compare strategies group by group (on micro-batches as the update):
    ``jagg`` is JAGG's own estimate here, without the control variate (cv_frac is set to 0).
    """
    update = dataclasses.replace(update, cv_frac=0.0)
    state = UpdateState(model, traj, advantages, update, sampler, ref_model)
    for index in state.micro_batches():
        state.use_samples(index)
        state.run_group(steps, kind)
    return state.finish()
