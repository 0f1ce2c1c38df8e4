"""JAGG's credit arithmetic, free of models: where each step's upstream gradient s_j goes.

Notation as in :mod:`jagg_engine.jagg`: a group of W steps t_0 > … > t_{W−1}, upstreams s (W, B, *S), and the
weights α_j of the far endpoint.

Where the far endpoint's weight goes (``alpha_scale`` = c): the far endpoint's state z_{W−1} contains the noise
ε_j that every inner step j injected, while an inner step's upstream s_j is proportional to A·ε_j at ratio 1
(∂ log π_j/∂v̂_j). So J_{W−1}ᵀ s_j pairs ε_j with a Jacobian that depends on it, and its expectation gains
E[A·(∂J_{W−1}/∂ε_j)ᵀ(…)], a term of the reward's curvature in the noise that the exact pairing J_jᵀ s_j (J_j
comes before ε_j) does not have; J_0 comes before every ε_j of the window. c scales the inner weights,
α_j ← c·α_j (:func:`jagg_alpha`): c = 1 is the paper's interpolation, c = 0 credits every inner step to the
near endpoint (s_base = Σ_{j < W−1} s_j, s_corr = s_{W−1}), at the same cost. Theorem 1's exactness needs
c = 1 (at c < 1 the estimate is exact where J does not depend on t or z).

Control variate (``cv_frac`` = p > 0, strategy jagg): JAGG's estimate is biased wherever the inner Jacobians
are not the interpolation of the endpoints' (its EXPECTED gradient differs from the exact one by
Σ_j E[((1 − α_j)·J_0 + α_j·J_{W−1} − J_j)ᵀ s_j]), and an optimiser, which averages the batch noise away,
settles where that bias balances the remaining signal. It is made unbiased as in "Linear Gradient
Prediction with Control Variates" (arXiv 2511.05187): the cheap prediction (JAGG) everywhere, plus the
correction (exact − JAGG) of a random part of it. JAGG's error is a sum over (sample i, inner step j) of
e_ij = (J_j − (1 − α_j)·J_0 − α_j·J_{W−1})ᵀ s_ij; for each inner step j, m = ceil(p·B) of the B samples are drawn
uniformly without replacement from the update's own random stream (a draw per step, as RLR draws the
sub-chain it backpropagates exactly, arXiv 2502.00639) and their e_ij added with weight w = B / m (each
pair is drawn with probability m / B):

    g_cv = g_jagg + w · Σ_j Σ_{i ∈ D_j} e_ij,      E_draw[g_cv] = g_jagg + Σ_ij e_ij = g_exact

Drawing pairs rather than whole samples costs the same and adds less variance where a sample's errors at
neighbouring steps point the same way (w·(e_i1 + e_i2) for a drawn sample against w·e_i1 and w·e_i2 drawn
apart). In one joint backward: both endpoints of every sample, and inner step j of its drawn samples D_j,
forwarded with grad; upstreams s_base − w·Σ_j 1[i ∈ D_j]·(1 − α_j)·s_ij at the first endpoint,
s_corr − w·Σ_j 1[i ∈ D_j]·α_j·s_ij at the last, and w·s_ij at (i ∈ D_j, j) (:func:`control_variate_upstream`).
At p = 1 every pair is drawn, w = 1, and the gradient is the exact one. Cost of a group: 2r + p·(W − 2)·r with
velocity reuse (the inner velocities of the pairs not drawn are the rollout's), (1 − p)·(W − 2) + 2r +
p·(W − 2)·r without.

Strategy pair (the unbiased estimator at JAGG's cost): each sample trains two steps of the group, one drawn from
each half of the window (:func:`pair_draw`), its loss weighted by the half's size (:func:`pair_weights`). Per
sample, E_draw[n_1·J_a^T s_a + n_2·J_b^T s_b] = Σ_j J_j^T s_j, so the gradient is the exact one in expectation
over the draw, at any σ, with no assumption on how J varies along the window. One forward with grad of 2B rows
and one backward: 2r a group, with or without velocity reuse. The price is variance: each drawn step counts n_h
times, and the steps not drawn are not seen.

Its control variate (``pair_cv`` = λ): the credits of every step are known (the rollout's velocities, or no-grad
forwards, as JAGG's inner steps), so each drawn step's upstream also carries λ times the OTHER half's credits
minus the other drawn step's weighted credit (:func:`pair_upstream`). That term's expectation over the other
half's draw is zero and the two halves are drawn independently, so the gradient stays unbiased; at λ = 1 the
upstreams sum to Σ_j s_j, and where J_a = J_b the estimate is J_aᵀ Σ_j s_j whatever the draw: what is left of the
draw's noise is (J_a − J_b)ᵀ(…), the Jacobian's change over the window, the same first-order difference JAGG
interpolates. JAGG's cost: 2r with velocity reuse, (W − 2) + 2r without.
"""

from __future__ import annotations

import math

import torch


def interpolation_weights(t: torch.Tensor) -> torch.Tensor:
    """Phase 3 (timestep-weighted aggregation): α_j = (t_0 − t_j) / (t_0 − t_{W−1}).

    Computed from the timesteps, not the index, so shifted schedules interpolate correctly.
    Shape: t (W,) decreasing → α (W,), α_0 = 0, α_{W−1} = 1.
    """
    if t.numel() < 2:
        raise ValueError("interpolation_weights: a group needs at least 2 timesteps")
    return (t[0] - t) / (t[0] - t[-1])


def jagg_alpha(t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The weights JAGG gives the far endpoint: α_j of :func:`interpolation_weights` with the inner ones scaled by
    ``scale`` (``UpdateConfig.alpha_scale``): α'_0 = 0, α'_{W−1} = 1 (each endpoint keeps its own credit) and
    α'_j = scale·α_j for 0 < j < W − 1. Shape: t (W,) → (W,)."""
    alpha = interpolation_weights(t)
    if scale == 1.0:
        return alpha
    inner = torch.zeros_like(alpha, dtype=torch.bool)
    inner[1:-1] = True
    return torch.where(inner, scale * alpha, alpha)


def aggregate_upstream(s: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 3: s_base = Σ_j (1 − α_j)·s_j and s_corr = Σ_j α_j·s_j.

    Shapes: s (W, B, *S), alpha (W,) → s_base, s_corr (B, *S).
    """
    a = alpha.to(s.dtype).reshape(-1, *([1] * (s.dim() - 1)))  # (W, 1, …, 1)
    return ((1 - a) * s).sum(dim=0), (a * s).sum(dim=0)


def group_shift(s: torch.Tensor, group: int) -> torch.Tensor:
    """Each sample's rows moved to the NEXT sample of its group of ``group`` consecutive samples (the last to the
    first): row i of the result is row π⁻¹(i) of ``s``, π(i) = g·G + (i − g·G + 1) mod G. The far endpoint of
    sample π(i) thus receives sample i's credit (``far_credit = cross``). Shape: (B, *S) → (B, *S), B a multiple
    of ``group``."""
    B = s.shape[0]
    if group < 2 or B % group:
        raise ValueError(
            f"far_credit: cross needs groups of >= 2 samples that divide the batch, got {B} and {group}"
        )
    return s.reshape(B // group, group, *s.shape[1:]).roll(1, dims=1).reshape(s.shape)


def far_upstream(s: torch.Tensor, alpha: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """The far endpoint's upstream s_corr = Σ_j α_j·s_j (:func:`aggregate_upstream`), or with ``group`` = G the
    cross-fitted one: the endpoints' own credits stay their own and each inner credit α_j·s_ij goes to the next
    sample of i's group, s_corr = α_0·s_0 + α_{W−1}·s_{W−1} + Σ_{0<j<W−1} α_j·group_shift(s_j).
    Shapes: s (W, B, *S), alpha (W,) → (B, *S)."""
    a = alpha.to(s.dtype).reshape(-1, *([1] * (s.dim() - 1)))  # (W, 1, …, 1)
    if group is None:
        return (a * s).sum(dim=0)
    out = a[0] * s[0] + a[-1] * s[-1]
    for k in range(1, s.shape[0] - 1):
        out = out + a[k] * group_shift(s[k], group)
    return out


def control_variate_count(batch: int, cv_frac: float) -> int:
    """m = ceil(p·B): how many of a group's B samples get the exact − JAGG correction (0 when p = 0, B at 1)."""
    return min(batch, math.ceil(round(cv_frac * batch, 9)))


def control_variate_draw(batch: int, cv_frac: float, generator: torch.Generator) -> torch.Tensor:
    """The samples of one inner step drawn for the correction: m = ceil(p·B) of range(B), uniformly without
    replacement from ``generator``, sorted. Shape: (m,) int64. Each sample is drawn with probability m / B."""
    m = control_variate_count(batch, cv_frac)
    return torch.randperm(batch, generator=generator)[:m].sort().values


def control_variate_upstream(
    s: torch.Tensor, alpha: torch.Tensor, drawn: list[torch.Tensor], weight: float
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Phase 3 with the control variate (module docstring): the upstreams of one joint backward whose outputs
    are v̂_0 and v̂_{W−1} of every sample and v̂_j of the samples ``drawn[j − 1]`` at each inner step j.

    Every sample starts from (s_base, s_corr) of :func:`aggregate_upstream`; a drawn pair (i, j), weighted
    w = ``weight``, adds w·e_ij, JAGG's error on it: −w·(1 − α_j)·s_ij at the first endpoint, −w·α_j·s_ij at the
    last, and w·s_ij at step j itself.
    Shapes: s (W, B, *S), alpha (W,), drawn W − 2 × (m_j,) → s_first, s_last (B, *S), W − 2 × (m_j, *S).
    """
    s_first, s_last = aggregate_upstream(s, alpha)
    s_inner = []
    for k, rows in enumerate(drawn, start=1):
        a = alpha[k].to(s.dtype)
        s_first = s_first.index_add(0, rows, s[k, rows], alpha=-weight * float(1 - a))
        s_last = s_last.index_add(0, rows, s[k, rows], alpha=-weight * float(a))
        s_inner.append(weight * s[k, rows])
    return s_first, s_last, s_inner


def pair_weights(window: int) -> torch.Tensor:
    """Strategy pair: the weight of each step of a group of W when it is drawn, the size of its half (the first
    half is steps 0 … ⌊W/2⌋ − 1, the second the rest). Each step is drawn with probability one over its half's
    size, so a weighted draw is unbiased. Shape: (W,) float64; all ones at W = 2 (every step drawn)."""
    if window < 2:
        raise ValueError(f"window: strategy pair needs a group of >= 2 steps, got {window}")
    half = window // 2
    return torch.tensor([float(half)] * half + [float(window - half)] * (window - half), dtype=torch.float64)


def pair_draw(batch: int, window: int, generator: torch.Generator) -> torch.Tensor:
    """Strategy pair: the two steps each of ``batch`` samples trains in a group of ``window``, one from each half
    (:func:`pair_weights`). Within a half of n steps the draw is balanced: each step is given ⌊B/n⌋ samples, the
    B mod n left over go to as many distinct steps drawn uniformly, and the labels are shuffled over the samples;
    so each step gets its share ± 1 and each sample any one step with probability exactly 1/n, whatever B.
    Shape: (batch, 2) int64, offsets into the group."""

    def balanced(n: int) -> torch.Tensor:
        q, r = divmod(batch, n)
        labels = torch.cat([torch.arange(n).repeat(q), torch.randperm(n, generator=generator)[:r]])
        return labels[torch.randperm(batch, generator=generator)]

    half = window // 2
    return torch.stack([balanced(half), half + balanced(window - half)], dim=1)


def pair_mix(choice: torch.Tensor, window: int, pair_frac: float, generator: torch.Generator) -> torch.Tensor:
    """Strategy pair with ``pair_frac`` = f < 1: B − ceil(f·B) of the batch's samples, drawn uniformly without
    replacement, train JAGG's two endpoints (offsets 0 and W − 1) instead of their drawn pair, in place in
    ``choice`` (B, 2). Returns the mask (B,) bool of those samples. Each sample is one of them with probability
    1 − ceil(f·B)/B, independently of its pair draw, so the expected gradient is that share of JAGG's plus the
    rest of the exact one: its bias is (1 − ceil(f·B)/B) times JAGG's, at the same cost."""
    B = choice.shape[0]
    mask = torch.zeros(B, dtype=torch.bool)
    n_jagg = B - control_variate_count(B, pair_frac)
    if n_jagg:
        rows = torch.randperm(B, generator=generator)[:n_jagg]
        mask[rows] = True
        choice[rows, 0], choice[rows, 1] = 0, window - 1
    return mask


def pair_upstream(
    s: torch.Tensor,
    choice: torch.Tensor,
    cv: float,
    jagg: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Strategy pair's upstreams at each sample's two drawn steps a (first half, n_1 steps) and b (second half,
    n_2 steps), with the control variate λ = ``cv`` (module docstring, "Strategy pair"):

        u_a = n_1·s_a + λ·(S_2 − n_2·s_b),    u_b = n_2·s_b + λ·(S_1 − n_1·s_a),    S_h = Σ_{j in half h} s_j

    Each correction is zero in expectation over the OTHER half's draw, so E[J_aᵀu_a + J_bᵀu_b] = Σ_j J_jᵀ s_j
    for any λ; at λ = 1, u_a + u_b = Σ_j s_j, and where J_a = J_b the draw's noise cancels.
    The samples of the mask ``jagg`` (B,) (:func:`pair_mix`; their choice is (0, W − 1)) take JAGG's upstreams
    instead, u_a = Σ_j (1 − α_j)·s_j and u_b = Σ_j α_j·s_j with ``alpha`` (W,) (:func:`aggregate_upstream`).
    Shapes: s (W, B, *S), choice (B, 2) offsets into the group → u_a, u_b (B, *S).
    """
    W, B = s.shape[0], s.shape[1]
    half = W // 2
    n1, n2 = float(half), float(W - half)
    rows = torch.arange(B, device=s.device)
    s_a, s_b = s[choice[:, 0], rows], s[choice[:, 1], rows]  # (B, *S)
    S1, S2 = s[:half].sum(0), s[half:].sum(0)
    u_a = n1 * s_a + cv * (S2 - n2 * s_b)
    u_b = n2 * s_b + cv * (S1 - n1 * s_a)
    if jagg is not None and bool(jagg.any()):
        if alpha is None:
            raise ValueError("pair_upstream: the JAGG samples of a mix need the window's alpha")
        base, corr = aggregate_upstream(s, alpha)
        m = jagg.to(s.device).reshape(-1, *([1] * (s.dim() - 2)))
        u_a, u_b = torch.where(m, base, u_a), torch.where(m, corr, u_b)
    return u_a, u_b


def auto_jagg_frac(cosines: list[float], threshold: float = 0.7) -> float:
    """Automatic routing: the fraction of groups in the LEADING run of groups (high noise first) whose measured
    cosine(g_jagg, g_exact) is at least ``threshold``; the first group below it and all later ones go exact.

    Returns n / G, which :func:`num_routed_groups` maps back to exactly n groups.
    """
    if not cosines:
        raise ValueError("auto_jagg_frac: no group cosines")
    n = 0
    for c in cosines:
        if not c >= threshold:  # NaN counts as below
            break
        n += 1
    return n / len(cosines)
