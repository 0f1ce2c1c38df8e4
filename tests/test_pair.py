"""Strategy pair — the unbiased estimator at JAGG's cost: each sample trains one step drawn from each half of
the group, its loss weighted by the half's size. Its draw, its definition by plain autograd, its expectation
(the exact gradient, computed over every draw), its cost and counts, and the trainer combinations.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_control_variate import flat_grad, gradient, make_case, rel_err, zero
from test_control_variate_trainer import COMBOS, gradients_of_steps, make_trainer, resumed_after
from test_jagg import velocities_and_upstreams

from jagg_engine.backbones.flux_core import TinyFlux
from jagg_engine.backbones.gauss_toy import GaussToy
from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.cost import cost_model_speedup, group_cost, predicted_speedup
from jagg_engine.credit import pair_draw, pair_mix, pair_upstream, pair_weights
from jagg_engine.grpo import ppo_clip_loss
from jagg_engine.jagg import UpdateConfig, reuse_steps
from jagg_engine.train.config import TrainConfig

F64 = torch.float64


def seed_of_every_draw(batch: int, window: int, n_groups: int = 1) -> dict[tuple, int]:
    """A generator seed for every distinct sequence of ``n_groups`` draws of :func:`pair_draw`."""
    half = window // 2
    per_group = 1
    for n in (half, window - half):
        # balanced: ways of giving each of n steps its share of the batch
        per_group *= math.comb(batch, batch // n) if n == 2 else 1  # B = 4: 2 + 2 samples, or all at one step
    wanted, seeds = per_group**n_groups, {}
    for seed in range(20_000):
        g = torch.Generator().manual_seed(seed)
        key = tuple(tuple(pair_draw(batch, window, g).flatten().tolist()) for _ in range(n_groups))
        seeds.setdefault(key, seed)
        if len(seeds) == wanted:
            return seeds
    raise AssertionError("not every draw was found")


# ---------------------------------------------------------------------------------------------- the draw


def test_weights_are_the_halves_sizes():
    assert pair_weights(2).tolist() == [1.0, 1.0]
    assert pair_weights(3).tolist() == [1.0, 2.0, 2.0]
    assert pair_weights(4).tolist() == [2.0, 2.0, 2.0, 2.0]
    assert pair_weights(5).tolist() == [2.0, 2.0, 3.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="window: strategy pair needs a group of >= 2 steps, got 1"):
        pair_weights(1)


@pytest.mark.parametrize("batch, window", [(8, 4), (7, 5), (6, 2)])
def test_each_sample_draws_one_step_of_each_half_balanced_and_uniformly(batch, window):
    half = window // 2
    counts = torch.zeros(batch, window, dtype=F64)
    for seed in range(2000):
        d = pair_draw(batch, window, torch.Generator().manual_seed(seed))
        assert d.shape == (batch, 2) and d.dtype == torch.int64
        assert ((0 <= d[:, 0]) & (d[:, 0] < half)).all() and ((half <= d[:, 1]) & (d[:, 1] < window)).all()
        per_step = torch.bincount(d.flatten(), minlength=window)
        for lo, hi in ((0, half), (half, window)):  # balanced: each step of a half gets its share ± 1
            assert per_step[lo:hi].max() - per_step[lo:hi].min() <= 1
        counts[torch.arange(batch), d[:, 0]] += 1
        counts[torch.arange(batch), d[:, 1]] += 1
    # every sample takes each step of a half with probability one over the half's size
    expected = 2000 / pair_weights(window)
    assert torch.allclose(counts / expected, torch.ones_like(counts), atol=0.12)


def test_the_draw_is_a_function_of_the_stream():
    a, b, c = (pair_draw(16, 4, torch.Generator().manual_seed(s)) for s in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------------------------------------- the gradient


@pytest.fixture(scope="module")
def one_window64():
    """The shipped shape: one window of 4 trained steps, ODE after it; B = 4, float64."""
    model = TinyFlux(dtype=F64)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 4), seed=4)
    return model, traj, adv, sampler


def pair_by_definition(model, traj, adv, sampler, draws: list[torch.Tensor], window: int) -> torch.Tensor:
    """Strategy pair's loss written out with plain autograd: every step forwarded on every sample, and sample i's
    loss at step j weighted by its half's size if i drew j, else 0 (a PPO loss times m ≥ 0 is the PPO loss of
    the advantage times m), over the usual 1/(B·K)."""
    K, B = len(traj.sde_steps), traj.batch_size
    total = 0
    for g, steps in enumerate([traj.sde_steps[i : i + window] for i in range(0, K, window)]):
        weights = pair_weights(len(steps))
        for k, j in enumerate(steps):
            mask = (draws[g] == k).any(dim=1).to(F64) * weights[k]
            v = model(traj.latents[j], traj.sigmas[j].expand(B), traj.cond)
            out = sampler.step(v, traj.latents[j], j, traj.sigmas, prev_sample=traj.latents[j + 1])
            total = total + ppo_clip_loss(out.log_prob, traj.log_probs[j], adv * mask, 1e-2)[0] / K
    return total


@pytest.mark.parametrize("micro_batch", [None, 3])
def test_one_draw_is_its_definition_by_plain_autograd(micro_batch):
    model = TinyFlux(dtype=F64)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 8), seed=1)  # two windows
    got, res = gradient(
        model, traj, adv, sampler, torch.Generator().manual_seed(7), strategy="pair", window=4,
        micro_batch=micro_batch,
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)
    draws = [pair_draw(4, 4, g) for _ in range(2)]
    params = model.trainable_parameters()
    zero(params)
    pair_by_definition(model, traj, adv, sampler, draws, window=4).backward()
    assert rel_err(got, flat_grad(params)) <= 1e-12
    n_micro = 1 if micro_batch is None else 2
    assert res.counts.forward_grad == 2 * n_micro and res.counts.backward == 2 * n_micro
    assert res.counts.forward_nograd == 0 and res.counts.reused == 0


@pytest.mark.parametrize(
    "window, micro_batch, pair_cv",
    [(4, None, 0.0), (3, None, 0.0), (4, None, 1.0), (4, 3, 1.0), (3, None, 0.5)],
)
def test_the_mean_over_every_possible_draw_is_the_exact_gradient(one_window64, window, micro_batch, pair_cv):
    """E_draw[g_pair] = g_exact at σ > 0 and off Theorem 1's condition, with and without the control variate,
    computed exactly over every draw, where JAGG's own gradient is off by more than a thousandth and no single
    draw is exact."""
    model, traj, adv, sampler = one_window64  # window 3: halves {0} and {1, 2}, then one exact step
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    seeds = seed_of_every_draw(4, window)
    assert len(seeds) == (36 if window == 4 else 6)
    grads = [
        gradient(
            model, traj, adv, sampler, torch.Generator().manual_seed(s), strategy="pair", window=window,
            micro_batch=micro_batch, pair_cv=pair_cv,
        )[0]
        for s in seeds.values()
    ]  # fmt: skip
    # λ > 0: TinyFlux's one backward of a draw's summed upstreams and the sum of its parts' backwards differ by
    # ~2e-9 in float64 (measured), so the mean is held to 1e-8 there; plain subsampling's to 1e-9
    assert rel_err(torch.stack(grads).mean(0), exact) <= (1e-8 if pair_cv else 1e-9)
    assert rel_err(jagg, exact) > 1e-3
    assert min(rel_err(g, exact) for g in grads) > 1e-4


def test_the_control_variate_narrows_the_draws_spread_on_the_linear_toy():
    """linear-toy with A trained, one window of 4 in 8 steps, all 36 draws: the estimates' root-mean-square distance
    to the exact gradient at pair_cv = 1 is below 0.9× plain subsampling's (measured: 0.78 against 0.93 of the
    exact gradient's norm). What is left is the Jacobian's change across the window (the next test: none left
    where it does not change); on TinyFlux it is most of the spread (0.98 against 0.99)."""
    model = LinearToy(dim=12, train_a=True)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 4), seed=4)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    spread = {}
    for cv in (0.0, 1.0):
        grads = torch.stack(
            [
                gradient(model, traj, adv, sampler, torch.Generator().manual_seed(s), strategy="pair", window=4,
                         pair_cv=cv)[0]
                for s in seed_of_every_draw(4, 4).values()
            ]
        )  # fmt: skip
        assert rel_err(grads.mean(0), exact) <= 1e-12  # the same mean
        spread[cv] = float(((grads - exact) ** 2).sum(1).mean().sqrt() / exact.norm())
    assert spread[1.0] < 0.9 * spread[0.0], spread


def test_with_the_jacobian_the_same_over_the_window_every_draw_is_exact():
    """gauss-toy (∂v/∂θ = I at every state): at pair_cv = 1 the upstreams sum to Σ_j s_j, so every draw is the
    exact gradient; plain subsampling's draws are not."""
    model = GaussToy(dim=32, dtype=F64)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 4), seed=3)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    for seed in range(4):
        cv, _ = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(seed), strategy="pair", window=4,
                         pair_cv=1.0)  # fmt: skip
        plain, _ = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(seed), strategy="pair",
                            window=4)  # fmt: skip
        assert rel_err(cv, exact) <= 1e-12 and rel_err(plain, exact) > 1e-3


def test_pair_upstream_by_hand():
    s = torch.arange(4 * 2, dtype=F64).reshape(4, 2) + 1  # W = 4 steps, B = 2 samples, S = ()
    choice = torch.tensor([[0, 2], [1, 3]])
    u_a, u_b = pair_upstream(s, choice, 1.0)
    # sample 0: a = 0, b = 2: u_a = 2 s_0 + (s_2 + s_3 − 2 s_2), u_b = 2 s_2 + (s_0 + s_1 − 2 s_0)
    assert u_a[0] == 2 * 1 + (5 + 7 - 2 * 5) and u_b[0] == 2 * 5 + (1 + 3 - 2 * 1)
    assert u_a[1] == 2 * 4 + (6 + 8 - 2 * 8) and u_b[1] == 2 * 8 + (2 + 4 - 2 * 4)
    assert torch.equal(u_a + u_b, s.sum(0))  # λ = 1: every credit placed once
    plain_a, plain_b = pair_upstream(s, choice, 0.0)
    assert torch.equal(plain_a, 2 * s[choice[:, 0], [0, 1]]) and torch.equal(
        plain_b, 2 * s[choice[:, 1], [0, 1]]
    )


@pytest.mark.parametrize("reuse", [False, True])
def test_the_control_variate_is_its_definition_by_plain_autograd_and_costs_what_jagg_costs(reuse):
    """pair_cv = 1: the gradient of Σ_i v̂_a·u_a + v̂_b·u_b with every s_j by plain autograd (1e-12); its model
    calls are JAGG's: one grad forward (2B rows) and one backward a window, and the credits of the steps a sample
    did not draw from the rollout (reuse: every step's velocity kept) or from one no-grad forward a window."""
    model = TinyFlux(dtype=F64)
    traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 8), seed=1, reuse=reuse)
    reuse_mode = "auto" if reuse else "off"
    got, res = gradient(
        model, traj, adv, sampler, torch.Generator().manual_seed(5), strategy="pair", window=4, pair_cv=1.0,
        reuse_rollout_velocity=reuse_mode,
    )  # fmt: skip
    g = torch.Generator().manual_seed(5)
    K, B = len(traj.sde_steps), traj.batch_size
    params = model.trainable_parameters()
    zero(params)
    total = 0
    for steps in (traj.sde_steps[:4], traj.sde_steps[4:]):
        choice = pair_draw(B, 4, g)
        vs, s = velocities_and_upstreams(model, traj, adv, sampler, 1e-2, steps)
        u_a, u_b = pair_upstream(s.detach(), choice, 1.0)
        v = torch.stack(vs)  # (W, B, *S)
        rows = torch.arange(B)
        total = total + (v[choice[:, 0], rows] * u_a).sum() + (v[choice[:, 1], rows] * u_b).sum()
    total.backward()
    assert rel_err(got, flat_grad(params)) <= 1e-12
    assert res.counts.forward_grad == 2 and res.counts.backward == 2
    if reuse:
        assert res.counts.forward_nograd == 0 and res.counts.reused == 2 * 4
    else:
        # one no-grad call a window, of its undrawn rows
        assert res.counts.forward_nograd == 2 and res.counts.reused == 0
    assert K == 8


def test_a_group_of_two_is_the_exact_gradient(one_window64):
    model, traj, adv, sampler = one_window64
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    pair, _ = gradient(model, traj, adv, sampler, torch.Generator().manual_seed(0), strategy="pair", window=2)
    assert rel_err(pair, exact) <= 1e-12


def test_over_two_windows_of_the_linear_toy_the_mean_over_every_draw_is_exact():
    """linear-toy with A trained (off Theorem 1's condition), two windows of 4: the mean over all 16 draws of
    the two groups is the exact gradient, where JAGG's is off."""
    model = LinearToy(dim=12, train_a=True)
    traj, adv, sampler = make_case(model, batch=2, num_steps=8, sde_window=(0, 8), seed=2)
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    seeds = seed_of_every_draw(2, 4, n_groups=2)
    assert len(seeds) == 16
    grads = [
        gradient(model, traj, adv, sampler, torch.Generator().manual_seed(s), strategy="pair", window=4)[0]
        for s in seeds.values()
    ]
    assert rel_err(torch.stack(grads).mean(0), exact) <= 1e-9
    assert rel_err(jagg, exact) > 1e-3


def test_a_pair_update_needs_a_generator(one_window64):
    model, traj, adv, sampler = one_window64
    with pytest.raises(ValueError, match="strategy: pair draws its steps from a generator"):
        gradient(model, traj, adv, sampler, strategy="pair", window=4)


def test_the_reported_loss_is_the_weighted_estimate_of_the_objective(one_window64):
    """The loss the run store gets is the pair's estimate of (1/K) Σ_j L_j: its mean over every draw is the
    exact update's loss."""
    model, traj, adv, sampler = one_window64
    _, exact = gradient(model, traj, adv, sampler, strategy="exact")
    losses = [
        gradient(model, traj, adv, sampler, torch.Generator().manual_seed(s), strategy="pair", window=4)[
            1
        ].loss
        for s in seed_of_every_draw(4, 4).values()
    ]
    assert sum(losses) / len(losses) == pytest.approx(exact.loss, rel=1e-9)


# ---------------------------------------------------------------------------------------------- cost


def test_cost_model_counts_a_pair_group_as_two_endpoint_backwards():
    assert group_cost(4, 1.8, "pair") == pytest.approx(3.6)
    assert group_cost(1, 1.8, "pair") == pytest.approx(1.8)  # a group of one step is exact
    assert cost_model_speedup(4, 1.8, 1.0, "pair", trained_steps=4) == pytest.approx(2.0)
    assert cost_model_speedup(4, 1.8, 1.0, "pair", trained_steps=5) == pytest.approx(9.0 / 5.4)
    # pair needs no rollout velocities: the same prediction with or without reuse, and on every mini-batch
    assert predicted_speedup(4, 1.8, 1.0, "pair", 8, reuse=False) == pytest.approx(2.0)
    assert predicted_speedup(4, 1.8, 1.0, "pair", 8, reuse=True, updates_per_rollout=2) == pytest.approx(2.0)


def test_cost_model_prices_pair_reading_every_credit_as_jagg():
    """pair_cv > 0 (or pair_frac < 1) reads every step's credit: the undrawn steps in one no-grad call a group,
    (n − 2) + 2r, or the rollout's velocities where reuse holds, 2r on the first mini-batch only."""
    assert group_cost(4, 1.8, "pair+cv") == pytest.approx(2 + 3.6)
    assert group_cost(4, 1.8, "pair+reuse+cv") == pytest.approx(3.6)
    assert predicted_speedup(4, 1.8, 1.0, "pair", 8, pair_credits=True) == pytest.approx(7.2 / 5.6)
    assert predicted_speedup(4, 1.8, 1.0, "pair", 8, reuse=True, pair_credits=True) == pytest.approx(2.0)
    both = predicted_speedup(4, 1.8, 1.0, "pair", 8, reuse=True, updates_per_rollout=2, pair_credits=True)
    assert both == pytest.approx(7.2 / (0.5 * 3.6 + 0.5 * 5.6))
    # a stored run's prediction (reports, Live) reads its pair_cv and pair_frac
    from jagg_engine.report.tables import config_speedup

    stored = TrainConfig(strategy="pair", reuse_rollout_velocity="off").validate().to_dict()
    assert config_speedup(stored, 1.8) == pytest.approx(
        predicted_speedup(4, 1.8, 1.0, "pair", 4, pair_credits=True)
    )
    for plain in ({"pair_cv": 0.0}, {"pair_cv": 0.0, "pair_frac": None}):
        assert config_speedup({**stored, **plain}, 1.8) == pytest.approx(2.0)
    assert config_speedup({**stored, "pair_cv": 0.0, "pair_frac": 0.5}, 1.8) == pytest.approx(7.2 / 5.6)


def test_jagg_bench_times_pair_with_its_credits_and_counts_their_calls():
    from jagg_engine.backbones.flux_core import TinyFlux
    from jagg_engine.bench import bench_backbone

    report = bench_backbone(
        "tiny-flux", TinyFlux(), window=4, jagg_frac=1.0, batch=4, steps=8, repeats=1,
        strategies=["exact", "pair", "pair+cv", "pair+reuse+cv"],
    )  # fmt: skip
    rows, r, K = report["strategies"], report["r"], report["trained_steps"]
    counts = {name: rows[name]["counts"] for name in rows}
    # 2 groups of 4: the undrawn steps of every sample in one no-grad call a group, or reused from the rollout
    assert counts["pair"]["forward_nograd"] == 0 and counts["pair"]["reused"] == 0
    assert counts["pair+cv"]["forward_nograd"] == 2 and counts["pair+cv"]["reused"] == 0
    assert counts["pair+reuse+cv"]["forward_nograd"] == 0 and counts["pair+reuse+cv"]["reused"] > 0
    for name in ("pair", "pair+cv", "pair+reuse+cv"):
        assert counts[name]["forward_grad"] == counts["pair"]["forward_grad"], name
        assert rows[name]["predicted_speedup"] == pytest.approx(cost_model_speedup(4, r, 1.0, name, K)), name
    assert rows["pair+cv"]["predicted_speedup"] < rows["pair+reuse+cv"]["predicted_speedup"]


# ---------------------------------------------------------------------------------------------- the trainer


@pytest.mark.parametrize("combo", list(COMBOS.values()), ids=list(COMBOS))
def test_pair_trains_through_every_combination_and_resumes_bit_for_bit(tmp_path, combo):
    """Window 2 (every step drawn): the exact run's gradient of the same window (1e-5, float32); window 4: a step after a resume
    gives the same weights as the run that went on (the draws come from the (seed, step, rank) stream)."""
    exact = make_trainer(tmp_path, "exact", "strategy=exact", "window=2", *combo)
    two = make_trainer(tmp_path, "two", "strategy=pair", "window=2", *combo)
    for a, b in zip(gradients_of_steps(two, [1, 2]), gradients_of_steps(exact, [1, 2])):
        assert rel(a, b) <= 1e-5
    whole = make_trainer(tmp_path, "whole", "strategy=pair", *combo)
    m1 = whole.train_step(1)
    # JAGG's cost: its control variate (pair_cv=1, the default) needs every step's velocity, from the rollout
    # where reuse holds and otherwise from one no-grad call of the undrawn rows, (W - 2)·B of them as JAGG's
    # W - 2 calls (a second update, or reuse off)
    m_jagg = make_trainer(tmp_path, "jagg", "strategy=jagg", *combo).train_step(1)
    assert (m1["count/forward_grad"], m1["count/backward"]) == (
        m_jagg["count/forward_grad"],
        m_jagg["count/backward"],
    )
    assert m1["count/forward_nograd"] == m_jagg["count/forward_nograd"] / 2  # W = 4: 1 call against 2
    resumed = resumed_after(whole, tmp_path, "resumed", "strategy=pair", *combo)
    whole.train_step(2)
    resumed.train_step(2)
    for p, q in zip(whole.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_two_processes_train_with_strategy_pair(tmp_path):
    from test_control_variate_trainer import SMALL_FLUX
    from toy import jagg

    from jagg_engine.store import open_store

    proc = jagg(
        "train", *SMALL_FLUX, "strategy=pair", "steps=2", "--processes", "2", "--runs-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = open_store(tmp_path)
    (run,) = store.list_runs()
    assert run["status"] == "finished"
    frame = store.metrics_frame(run["id"])
    # one window of 4 per rank: ONE grad forward and ONE backward a step, no inner forward
    assert frame.loc[frame.step > 0, "count/forward_grad"].tolist() == [1.0, 1.0]
    assert frame.loc[frame.step > 0, "count/forward_nograd"].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------- switch_to pair


def test_jagg_until_step_with_switch_to_pair_trains_jagg_then_pair_and_resumes_bit_for_bit(tmp_path):
    """jagg_until_step = 1, switch_to = pair: step 1 is one JAGG backward per window (inner steps reused), step 2
    the pair run's gradient from the same weights (one grad forward, one backward, no inner step); a trainer
    resumed after step 1 ends step 2 on the same weights; the optimizer state carries over."""
    switch = make_trainer(tmp_path, "switch", "jagg_until_step=1", "switch_to=pair")
    m1 = switch.train_step(1)
    assert (m1["route/jagg"], m1["count/backward"], m1["count/reused"]) == (1.0, 1.0, 2.0)
    pair = resumed_after(switch, tmp_path, "pair", "strategy=pair")
    resumed = resumed_after(switch, tmp_path, "resumed", "jagg_until_step=1", "switch_to=pair")
    jagg = resumed_after(switch, tmp_path, "jagg", "strategy=jagg")
    g_switch, g_pair, g_jagg = (gradients_of_steps(t, [2]) for t in (switch, pair, jagg))
    assert rel(g_switch[0], g_pair[0]) <= 1e-6 and rel(g_switch[0], g_jagg[0]) > 1e-3
    assert switch.update.strategy == "pair"
    resumed.train_step(2)
    for p, q in zip(switch.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert all(float(s["step"]) == 2 for s in switch.optimizer.state_dict()["state"].values())


def test_the_cost_model_counts_a_switch_to_pair_at_jaggs_cost():
    from jagg_engine.cost import switched_speedup
    from jagg_engine.report.tables import config_speedup

    assert switched_speedup(2.0, 70, 40, other_speedup=2.0) == pytest.approx(2.0)
    assert switched_speedup(2.0, 70, 40) == pytest.approx(70 / (20 + 30))
    config = {"window": 4, "jagg_frac": 1.0, "strategy": "jagg", "sde_window_start": 0, "sde_window_end": 4,
              "sampling_steps": 12, "steps": 70, "jagg_until_step": 40, "reuse_rollout_velocity": "auto"}  # fmt: skip
    to_exact = config_speedup(config, 1.8)
    to_pair = config_speedup({**config, "switch_to": "pair"}, 1.8)
    assert to_pair == pytest.approx(2.0) and to_exact == pytest.approx(70 / (40 / 2.0 + 30))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["switch_to=pair"],
            "switch_to: the backward outside JAGG's span; needs jagg_from_step or jagg_until_step",
        ),
        (["jagg_until_step=5", "switch_to=jagg"], "switch_to: must be one of exact, pair, got 'jagg'"),
    ],
)
def test_switch_to_refusals_name_the_field(overrides, line):
    from test_control_variate_trainer import SMALL_FLUX

    from jagg_engine.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=f"^{line}"):
        load_config(None, [*SMALL_FLUX, *overrides], check_environment=False)


def test_a_rollout_keeps_every_steps_velocity_for_the_control_variate_and_none_without_it():
    cv = UpdateConfig(strategy="pair", window=4, pair_cv=1.0, reuse_rollout_velocity="auto")
    assert reuse_steps([0, 1, 2, 3, 4, 5, 6, 7, 8], cv) == [0, 1, 2, 3, 4, 5, 6, 7]  # step 8: a group of one
    assert (
        reuse_steps([0, 1, 2, 3], UpdateConfig(strategy="pair", window=4, reuse_rollout_velocity="auto"))
        == []
    )
    with pytest.raises(ValueError, match="pair_cv: only with strategy pair"):
        UpdateConfig(strategy="jagg", pair_cv=0.5)
    with pytest.raises(ValueError, match=r"pair_cv: must be in \[0, 1\], got 1.5"):
        UpdateConfig(strategy="pair", pair_cv=1.5)


# ---------------------------------------------------------------------------------------------- pair_frac: a mix


def test_a_mix_gives_jaggs_endpoints_to_a_uniform_share_of_the_samples():
    """pair_frac = f: B − ceil(f·B) samples take offsets (0, W − 1), the others keep their pair; each sample is
    one of them with probability 1 − ceil(f·B)/B, whatever its pair."""
    hits = torch.zeros(7)
    for seed in range(3000):
        g = torch.Generator().manual_seed(seed)
        choice = pair_draw(7, 5, g)
        drawn = choice.clone()
        mask = pair_mix(choice, 5, 0.6, g)  # ceil(4.2) = 5 pairs, 2 samples on JAGG's endpoints
        assert int(mask.sum()) == 2
        assert choice[mask].tolist() == [[0, 4], [0, 4]] and torch.equal(choice[~mask], drawn[~mask])
        hits += mask
    assert torch.allclose(hits / 3000, torch.full((7,), 2 / 7), atol=0.03)
    assert not pair_mix(pair_draw(7, 5, g), 5, 1.0, g).any()


def test_pair_upstream_of_a_mix_by_hand():
    s = torch.arange(4 * 2, dtype=F64).reshape(4, 2) + 1  # W = 4 steps, B = 2 samples, S = ()
    choice = torch.tensor([[1, 2], [0, 3]])  # sample 1 on JAGG's endpoints
    alpha = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=F64)
    u_a, u_b = pair_upstream(s, choice, 1.0, torch.tensor([False, True]), alpha)
    pair_a, pair_b = pair_upstream(s, choice, 1.0)
    assert u_a[0] == pair_a[0] and u_b[0] == pair_b[0]  # sample 0 keeps its pair's upstreams
    # sample 1: s = 2, 4, 6, 8 over the steps; base Σ(1 − α)s = 2 + 3 + 3 + 0, corr Σ α·s = 0 + 1 + 3 + 8
    assert u_a[1].item() == 8.0 and u_b[1].item() == 12.0
    with pytest.raises(ValueError, match="need the window's alpha"):
        pair_upstream(s, choice, 1.0, torch.tensor([False, True]))


def mix_by_definition(model, traj, adv, sampler, seed: int, pair_frac: float, cv: float) -> torch.Tensor:
    """The mix's loss with plain autograd: every step of the one window forwarded on every sample; the drawn rows
    get the pair's upstreams, JAGG's samples Σ_j (1 − α_j)·s_j at step 0 and Σ_j α_j·s_j at step W − 1, α_j =
    (t_0 − t_j)/(t_0 − t_{W−1})."""
    g = torch.Generator().manual_seed(seed)
    steps, B = traj.sde_steps[:4], traj.batch_size
    choice = pair_draw(B, 4, g)
    mask = pair_mix(choice, 4, pair_frac, g)
    vs, s = velocities_and_upstreams(model, traj, adv, sampler, 1e-2, steps)
    s = s.detach()
    u_a, u_b = pair_upstream(s, choice, cv)  # the pair's, without the mask
    t = traj.sigmas[steps]
    alpha = ((t[0] - t) / (t[0] - t[-1])).to(F64).reshape(-1, *([1] * (s.dim() - 1)))
    m = mask.reshape(-1, *([1] * (s.dim() - 2)))
    u_a = torch.where(m, ((1 - alpha) * s).sum(0), u_a)
    u_b = torch.where(m, (alpha * s).sum(0), u_b)
    v, rows = torch.stack(vs), torch.arange(B)
    return (v[choice[:, 0], rows] * u_a).sum() + (v[choice[:, 1], rows] * u_b).sum()


@pytest.mark.parametrize("cv, reuse", [(1.0, False), (1.0, True), (0.0, True)])
def test_a_mix_is_its_definition_by_plain_autograd_at_jaggs_cost(one_window64, cv, reuse):
    model, traj, adv, sampler = one_window64
    if reuse:
        traj, adv, sampler = make_case(model, batch=4, num_steps=8, sde_window=(0, 4), seed=4, reuse=True)
    got, res = gradient(
        model, traj, adv, sampler, torch.Generator().manual_seed(3), strategy="pair", window=4, pair_cv=cv,
        pair_frac=0.5, reuse_rollout_velocity="auto" if reuse else "off",
    )  # fmt: skip
    params = model.trainable_parameters()
    zero(params)
    mix_by_definition(model, traj, adv, sampler, 3, 0.5, cv).backward()
    assert rel_err(got, flat_grad(params)) <= 1e-12
    assert (res.counts.forward_grad, res.counts.backward) == (1, 1)
    assert (res.counts.forward_nograd, res.counts.reused) == ((0, 4) if reuse else (1, 0))  # 4 steps read


def test_the_mix_over_every_draw_keeps_that_share_of_jaggs_bias(one_window64):
    """E_draw[g_mix] = f'·g_exact + (1 − f')·g_jagg with f' = ceil(f·B)/B, computed over every one of the 6 × 36
    equally likely (mix, pair) draws at B = 4, f = 0.5: the expected gradient's bias is half of JAGG's."""
    model, traj, adv, sampler = one_window64
    exact, _ = gradient(model, traj, adv, sampler, strategy="exact")
    jagg, _ = gradient(model, traj, adv, sampler, window=4)
    seeds: dict[tuple, int] = {}
    for seed in range(20_000):
        g = torch.Generator().manual_seed(seed)
        choice = pair_draw(4, 4, g)
        key = (tuple(choice.flatten().tolist()), tuple(pair_mix(choice, 4, 0.5, g).tolist()))
        seeds.setdefault(key, seed)
        if len(seeds) == 6 * 36:
            break
    assert len(seeds) == 6 * 36
    grads = [
        gradient(model, traj, adv, sampler, torch.Generator().manual_seed(s), strategy="pair", window=4,
                 pair_frac=0.5, pair_cv=1.0)[0]
        for s in seeds.values()
    ]  # fmt: skip
    mean = torch.stack(grads).mean(0)
    assert rel_err(mean, 0.5 * exact + 0.5 * jagg) <= 1e-8  # TinyFlux's summed-upstream round-off, as above
    assert rel_err(jagg, exact) > 1e-3


def test_a_mix_trains_with_micro_batches_and_resumes_bit_for_bit(tmp_path):
    combo = COMBOS["micro-mini-batches"]
    whole = make_trainer(tmp_path, "whole", "strategy=pair", "pair_frac=0.5", *combo)
    m1 = whole.train_step(1)
    m_jagg = make_trainer(tmp_path, "jagg", "strategy=jagg", *combo).train_step(1)
    assert (m1["count/forward_grad"], m1["count/backward"]) == (
        m_jagg["count/forward_grad"],
        m_jagg["count/backward"],
    )
    resumed = resumed_after(whole, tmp_path, "resumed", "strategy=pair", "pair_frac=0.5", *combo)
    whole.train_step(2)
    resumed.train_step(2)
    for p, q in zip(whole.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_pair_frac_refusals_and_the_rollouts_velocities():
    from test_control_variate_trainer import SMALL_FLUX

    from jagg_engine.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^pair_frac: must be a number in \(0, 1\], got 0.0"):
        load_config(None, [*SMALL_FLUX, "strategy=pair", "pair_frac=0"], check_environment=False)
    with pytest.raises(
        ConfigError, match="^pair_frac: the share of samples strategy pair draws; needs strategy"
    ):
        load_config(None, [*SMALL_FLUX, "pair_frac=0.5"], check_environment=False)
    with pytest.raises(ValueError, match="pair_frac: only with strategy pair"):
        UpdateConfig(strategy="jagg", pair_frac=0.5)
    mix = UpdateConfig(strategy="pair", window=4, pair_frac=0.5, reuse_rollout_velocity="auto")
    assert reuse_steps([0, 1, 2, 3], mix) == [0, 1, 2, 3]  # JAGG's samples read every step's credit
