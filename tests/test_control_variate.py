"""The control variate (cv_frac): JAGG made unbiased — its exact limit, its expectation, its cost and counts.

g_cv = g_jagg + w·Σ_j Σ_{i ∈ D_j} e_ij: JAGG's error e_ij on m = ceil(p·B) samples D_j drawn per inner step j,
weighted w = B / m.
"""

import itertools
import math

import pytest
import torch

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.backbones.gauss_toy import GaussToy
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.cost import cost_model_speedup, group_cost, predicted_speedup
from jagg_engine.credit import (
    aggregate_upstream,
    control_variate_count,
    control_variate_draw,
    control_variate_upstream,
)
from jagg_engine.jagg import UpdateConfig, policy_update
from jagg_engine.sde import SamplerConfig, rollout

F64 = torch.float64


def flat_grad(params):
    return torch.cat(
        [p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten() for p in params]
    )


def zero(params):
    for p in params:
        p.grad = None


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def make_case(model, batch=4, num_steps=8, sde_window=(0, 8), seed=0, reuse=False):
    """A rollout of ``model`` with old log-probs nudged (ratios ≠ 1) and N(0, 1) advantages."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    sampler = SamplerConfig(num_steps=num_steps, shift=3.0, sde_window=sde_window)
    cond = model.encode_prompts(
        ["a red circle", "a blue square", "a cat", "a dog", "a tree", "a car"][:batch]
    )
    noise = torch.randn(batch, *model.latent_shape, generator=g, dtype=dtype)
    traj = rollout(model, cond, noise, sampler, generator=g, store_velocities=reuse)
    traj.log_probs = traj.log_probs + 0.01 * torch.randn(traj.log_probs.shape, generator=g, dtype=F64)
    adv = torch.randn(batch, generator=g, dtype=F64)
    return traj, adv, sampler


def gradient(model, traj, adv, sampler, generator=None, **update):
    params = model.trainable_parameters()
    zero(params)
    result = policy_update(
        model, traj, adv, UpdateConfig(clip_range=1e-2, **update), sampler, generator=generator
    )
    return flat_grad(params), result


@pytest.fixture(scope="module")
def flux64():
    model = TinyFlux(dtype=F64)
    traj, adv, sampler = make_case(model)
    return model, traj, adv, sampler


# ---------------------------------------------------------------------------------------------- pure math


def test_count_is_ceil_of_p_times_b():
    assert [control_variate_count(8, p) for p in (0.0, 0.01, 0.125, 0.3, 0.5, 1.0)] == [0, 1, 1, 3, 4, 8]
    assert control_variate_count(10, 0.3) == 3  # 0.3·10 is 3.0000000000000004 in binary


def test_draw_is_m_distinct_sorted_samples_and_a_function_of_the_stream():
    a = control_variate_draw(16, 0.25, torch.Generator().manual_seed(5))
    b = control_variate_draw(16, 0.25, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and len(a) == 4 and len(set(a.tolist())) == 4
    assert torch.equal(a, a.sort().values) and 0 <= int(a.min()) and int(a.max()) < 16
    # every sample is drawn with probability m / B: over many streams the counts are flat
    counts = torch.zeros(16)
    for seed in range(2000):
        counts[control_variate_draw(16, 0.25, torch.Generator().manual_seed(seed))] += 1
    expected = 2000 * 4 / 16
    assert (counts - expected).abs().max() < 5 * math.sqrt(expected)


def test_upstream_by_hand():
    s = (
        torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=F64)[:, None, None]
        * torch.tensor([1.0, 10.0])[None, :, None]
    )
    alpha = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=F64)  # s: (W=4, B=2, 1), sample 1 = 10 × sample 0
    s_base, s_corr = aggregate_upstream(s, alpha)
    # inner step 1 draws sample 1, inner step 2 draws nobody; w = 3
    first, last, inner = control_variate_upstream(
        s, alpha, [torch.tensor([1]), torch.tensor([], dtype=torch.long)], 3.0
    )
    # sample 0 is drawn nowhere: JAGG's upstream
    assert first[0].item() == pytest.approx(1 + 0.75 * 2 + 0.5 * 4)
    assert last[0].item() == pytest.approx(0.25 * 2 + 0.5 * 4 + 8)
    # pair (1, step 1): its share of s_base (1 − α_1 = 0.75) and of s_corr (α_1 = 0.25) taken off w times,
    # and w·s_11 at step 1 itself
    assert first[1].item() == pytest.approx(s_base[1].item() - 3 * 0.75 * 20)
    assert last[1].item() == pytest.approx(s_corr[1].item() - 3 * 0.25 * 20)
    assert [t.shape for t in inner] == [(1, 1), (0, 1)] and inner[0].item() == pytest.approx(60.0)
    # every pair drawn with w = 1: each endpoint keeps its own s only, each inner step gets its own s
    every = torch.arange(2)
    first, last, inner = control_variate_upstream(s, alpha, [every, every], 1.0)
    torch.testing.assert_close(first, s[0])
    torch.testing.assert_close(last, s[3])
    torch.testing.assert_close(torch.stack(inner), s[1:3])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cv_frac": 1.5}, "^cv_frac: must be in \\[0, 1\\]"),
        ({"cv_frac": -0.1}, "^cv_frac: must be in \\[0, 1\\]"),
        ({"cv_frac": 0.5, "strategy": "exact"}, "^cv_frac: only with strategy jagg"),
        ({"cv_frac": 0.5, "strategy": "endpoint"}, "^cv_frac: only with strategy jagg"),
    ],
)
def test_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        UpdateConfig(**kwargs)


def test_a_control_variate_without_a_generator_is_refused(flux64):
    model, traj, adv, sampler = flux64
    with pytest.raises(ValueError, match="^cv_frac: a control variate needs a generator"):
        gradient(model, traj, adv, sampler, window=4, cv_frac=0.5)


# ---------------------------------------------------------------------------------------------- the exact limit


@pytest.mark.parametrize(
    "update",
    [
        {"window": 4},
        {"window": 3},
        {"window": 8},
        {"window": 4, "micro_batch": 3},
        {"window": 4, "endpoint_backward": "sequential"},
        {"window": 4, "jagg_frac": 0.5},
    ],
    ids=["w4", "w3-trailing-group", "w8", "micro-batches", "sequential", "routed"],
)
def test_cv_frac_one_is_the_exact_gradient(flux64, update):
    model, traj, adv, sampler = flux64
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    cv, result = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(0), cv_frac=1.0, **update)
    jagg, _ = gradient(model, traj, adv, sampler, **update)
    assert rel_err(cv, exact) <= 1e-6
    assert rel_err(jagg, exact) > 1e-3  # JAGG alone is not exact here: the limit is the correction's doing
    assert result.counts.cv_pairs > 0


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
def test_cv_frac_one_is_exact_under_every_sde_kind(kind):
    model = TinyFlux(dtype=F64)
    g = torch.Generator().manual_seed(1)
    sampler = SamplerConfig(kind=kind, num_steps=8, shift=3.0, eta=0.7)
    cond = model.encode_prompts(["a", "b", "c"])
    traj = rollout(model, cond, torch.randn(3, *model.latent_shape, generator=g, dtype=F64), sampler, g)
    adv = torch.randn(3, generator=g, dtype=F64)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    cv, _ = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(0), window=4, cv_frac=1.0)
    assert rel_err(cv, exact) <= 1e-6


def test_cv_frac_one_with_velocity_reuse_is_exact_and_reuses_nothing_it_recomputes():
    model = TinyFlux()  # float32, on-policy: the rollout's velocities are the policy's
    model.eval()
    traj, adv, sampler = make_case(model, batch=4, reuse=True)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    cv, res = gradient(
        model, traj, adv, sampler, torch.Generator().manual_seed(0), window=4, cv_frac=1.0,
        reuse_rollout_velocity="auto",
    )  # fmt: skip
    assert rel_err(cv, exact) <= 1e-5  # float32
    assert res.counts.reused == 0  # every sample drawn: no velocity of the rollout is needed
    half, res = gradient(
        model, traj, adv, sampler, torch.Generator().manual_seed(0), window=4, cv_frac=0.5,
        reuse_rollout_velocity="auto",
    )  # fmt: skip
    assert res.counts.reused == 2 * 2 and res.counts.forward_nograd == 0  # 2 groups × 2 inner steps


def test_cv_frac_zero_is_plain_jagg_bitwise(flux64):
    model, traj, adv, sampler = flux64
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    cv, res = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(0), window=4, cv_frac=0.0)
    assert torch.equal(cv, jagg) and res.counts.cv_pairs == 0


# ---------------------------------------------------------------------------------------------- unbiased


def _streams_for_every_draw(batch: int, cv_frac: float, n_draws: int) -> dict[tuple, int]:
    """A generator seed for every combination of ``n_draws`` successive draws (one per inner step)."""
    combos = {}
    m = control_variate_count(batch, cv_frac)
    wanted = math.comb(batch, m) ** n_draws
    for seed in range(100_000):
        g = torch.Generator().manual_seed(seed)
        key = tuple(tuple(control_variate_draw(batch, cv_frac, g).tolist()) for _ in range(n_draws))
        combos.setdefault(key, seed)
        if len(combos) == wanted:
            return combos
    raise AssertionError("not every draw was found")


@pytest.fixture(scope="module")
def one_window64():
    """The shipped shape: one JAGG window of 4 trained steps (2 inner), ODE after it."""
    model = TinyFlux(dtype=F64)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 4), seed=4)
    return model, traj, adv, sampler


@pytest.mark.parametrize("micro_batch", [None, 3])
def test_the_mean_over_every_possible_draw_is_the_exact_gradient(one_window64, micro_batch):
    """E_draw[g_cv] = g_exact, computed exactly: the engine's gradient for each of the C(B, m)^(W − 2) draws."""
    model, traj, adv, sampler = one_window64  # W = 4: 2 inner steps; B = 4, p = 0.25: m = 1 per step
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    seeds = _streams_for_every_draw(4, 0.25, n_draws=2)
    assert len(seeds) == 16
    grads = []
    for seed in seeds.values():
        g, res = gradient(
            model, traj, adv, sampler, torch.Generator().manual_seed(seed), window=4, cv_frac=0.25,
            micro_batch=micro_batch,
        )  # fmt: skip
        assert res.counts.cv_pairs == 2  # one sample at each of the two inner steps
        grads.append(g)
    assert rel_err(torch.stack(grads).mean(0), exact) <= 1e-9
    assert rel_err(jagg, exact) > 1e-3  # while JAGG's own gradient is off by more than a thousandth
    assert min(rel_err(g, exact) for g in grads) > 1e-4  # and no single draw is the exact gradient


@pytest.mark.parametrize(
    "name, model, steps",
    [
        ("linear-toy (A trained, off the line)", LinearToy(dim=12, train_a=True), 8),
        ("gauss-toy", GaussToy(dim=32, dtype=F64), 8),
    ],
    ids=["linear-toy", "gauss-toy"],
)
def test_monte_carlo_mean_over_draws_converges_to_exact(name, model, steps):
    """The mean of N draws from the stream is within 4 standard errors of the exact gradient; JAGG's own
    bias is many standard errors away from it (the test could see a biased estimator). On tiny-flux the
    expectation is computed exactly instead, over every draw (the test above)."""
    traj, adv, sampler = make_case(model, batch=6, num_steps=steps, sde_window=(0, steps), seed=2)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [gradient(model, traj, adv, sampler, gen, window=4, cv_frac=1 / 3)[0] for _ in range(300)]
    )
    mean, n = draws.mean(0), draws.shape[0]
    se = (draws.var(0, unbiased=True).sum() / n).sqrt()  # standard error of ‖mean − E‖
    err = (mean - exact).norm()
    bias = (jagg - exact).norm()
    if bias <= 1e-12 * exact.norm():  # gauss-toy: ∂v/∂θ = I, JAGG is exact (Theorem 1): no correction
        assert err <= 1e-12 * exact.norm()
        return
    assert err <= 4 * se, f"{name}: the mean over draws is {err / se:.1f} standard errors from exact"
    assert bias >= 10 * se, f"{name}: JAGG's bias {bias / se:.1f} SE: too small for the test to see one"
    # and the half-sample mean is farther than the whole one (it converges)
    assert (draws[: n // 4].mean(0) - exact).norm() >= 0.5 * err


def test_draws_follow_the_stream_and_vary_between_streams(one_window64):
    model, traj, adv, sampler = one_window64
    runs = [
        gradient(model, traj, adv, sampler, torch.Generator().manual_seed(seed), window=4, cv_frac=0.25)[0]
        for seed in (11, 11, 12, 13)
    ]
    assert torch.equal(runs[0], runs[1])
    assert not (torch.equal(runs[0], runs[2]) and torch.equal(runs[0], runs[3]))


def test_counts_and_cost_model_of_a_control_variate_group(flux64):
    model, traj, adv, sampler = flux64
    _, res = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(0), window=4, cv_frac=0.5)
    # per group: ONE grad forward (2 endpoints × 4 samples + 2 inner steps × 2 drawn), ONE backward, and
    # each inner step of the 2 samples it did not draw without grad
    assert res.counts.forward_grad == 2 and res.counts.backward == 2 and res.counts.forward_nograd == 2 * 2
    assert res.counts.cv_pairs == 2 * 2 * 2
    # cost: (1 − p)(W − 2) + 2r + p(W − 2) r; with reuse 2r + p(W − 2) r; p = 1 is exact, p = 0 JAGG
    r = 1.8
    assert group_cost(4, r, "jagg", cv_frac=0.5) == pytest.approx(0.5 * 2 + 2 * r + 0.5 * 2 * r)
    assert group_cost(4, r, "jagg+reuse", cv_frac=0.5) == pytest.approx(2 * r + 0.5 * 2 * r)
    assert group_cost(4, r, "jagg", cv_frac=1.0) == pytest.approx(group_cost(4, r, "exact"))
    assert group_cost(4, r, "jagg+reuse", cv_frac=0.0) == group_cost(4, r, "jagg+reuse")
    assert cost_model_speedup(4, r, 1.0, "jagg+reuse", cv_frac=0.125) == pytest.approx(
        4 * r / (2 * r + 0.25 * r)
    )
    assert predicted_speedup(4, r, 1.0, "jagg", 4, reuse=True, cv_frac=1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="^cv_frac: "):
        group_cost(4, r, "endpoint", cv_frac=0.5)


def test_theorem1_the_correction_is_zero_where_jagg_is_exact():
    """Linear toy with A fixed (Theorem 1): JAGG is exact, so every draw gives the exact gradient."""
    model = LinearToy()
    traj, adv, sampler = make_case(model, batch=5, num_steps=8, seed=3)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    for seed, p in itertools.product(range(3), (0.2, 0.6)):
        cv, _ = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(seed), window=4, cv_frac=p)
        assert rel_err(cv, exact) <= 1e-9


def test_jagg_bench_times_the_control_variate_and_predicts_it_by_the_cost_model():
    from jagg_engine.backbones.flux_core import TinyFlux
    from jagg_engine.bench import bench_backbone

    report = bench_backbone(
        "tiny-flux", TinyFlux(), window=4, jagg_frac=1.0, batch=4, steps=8, repeats=1, cv_frac=0.5,
        strategies=["exact", "jagg+reuse", "jagg+reuse+cv"],
    )  # fmt: skip
    rows, r, K = report["strategies"], report["r"], report["trained_steps"]
    assert report["cv_frac"] == 0.5
    # 2 groups × 2 inner steps × m = ceil(0.5 · 4) = 2 drawn samples; the others' inner velocities reused
    assert rows["jagg+reuse+cv"]["counts"]["cv_pairs"] == 8 and rows["jagg+reuse+cv"]["counts"]["reused"] == 4
    assert rows["jagg+reuse"]["counts"]["cv_pairs"] == 0
    assert rows["jagg+reuse+cv"]["predicted_speedup"] == pytest.approx(
        cost_model_speedup(4, r, 1.0, "jagg+reuse", K, cv_frac=0.5)
    )
    assert rows["jagg+reuse+cv"]["predicted_speedup"] < rows["jagg+reuse"]["predicted_speedup"]


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_jagg_bench_refuses_a_bad_cv_frac_in_one_line(value, capsys):
    from jagg_engine import cli

    try:
        code = cli.main(["bench", "--backbone", "tiny-flux", "--cv-frac", value])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert (
        code == 2
        and err.endswith(f"cv_frac: must be in (0, 1], got {float(value)}")
        and len(err.splitlines()) == 1
    )
