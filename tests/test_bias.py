"""`jagg study bias`: JAGG's EXPECTED-gradient bias — its pieces against the engine's update, its estimators
on vectors whose expectation is known, and the command on a tiny-shapes run and a tiny FLUX checkpoint."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_backbones_diffusers import save_tiny_flux  # noqa: E402
from test_eval_run import SMALL, jagg  # noqa: E402

from jagg_engine.backbones.flux_core import TinyFlux  # noqa: E402
from jagg_engine.bias import BiasAccumulator, InnerStep, RolloutGradients, rollout_gradients  # noqa: E402
from jagg_engine.jagg import UpdateConfig, policy_update  # noqa: E402
from jagg_engine.sde import SamplerConfig, rollout  # noqa: E402
from jagg_engine.store import open_store  # noqa: E402
from jagg_engine.train.config import load_config  # noqa: E402
from jagg_engine.train.trainer import Trainer  # noqa: E402

F64 = torch.float64


def flat_grad(params):
    return torch.cat(
        [p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten() for p in params]
    )


# ---------------------------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize(
    "update", [{"window": 4}, {"window": 3, "micro_batch": 2}, {"window": 4, "jagg_frac": 0.5}]
)
def test_rollout_gradients_are_the_updates_exact_and_jagg_gradients(update):
    model = TinyFlux(dtype=F64)
    params = model.trainable_parameters()
    g = torch.Generator().manual_seed(0)
    sampler = SamplerConfig(num_steps=8, shift=3.0)
    cond = model.encode_prompts(["a", "b", "c"])
    traj = rollout(model, cond, torch.randn(3, *model.latent_shape, generator=g, dtype=F64), sampler, g)
    adv = torch.randn(3, generator=g, dtype=F64)
    cfg = UpdateConfig(clip_range=1e-2, **update)
    grads = {}
    for strategy in ("exact", "jagg"):
        for p in params:
            p.grad = None
        policy_update(
            model, traj, adv, UpdateConfig(clip_range=1e-2, **{**update, "strategy": strategy}), sampler
        )
        grads[strategy] = flat_grad(params).double()
    for p in params:
        p.grad = None
    r = rollout_gradients(model, params, traj, adv, cfg, sampler)
    rel = lambda x, y: float((x - y).norm() / y.norm())  # noqa: E731
    assert rel(r.exact, grads["exact"]) <= 1e-10
    # the update forwards both endpoints batched, the study one by one: float64 round-off apart
    assert rel(r.jagg, grads["jagg"]) <= 1e-8
    assert not torch.allclose(r.jagg, r.exact)
    # the inner steps' pieces rebuild the difference: g_jagg − g_exact = Σ_j (α_j·u_j − w_j)
    err = sum(s.alpha * (s.b - s.a) - (s.c - s.a) for s in r.inner)
    assert rel(err, r.jagg - r.exact) <= 1e-9
    assert all(p.grad is None for p in params)  # the study's products leave .grad alone


# ---------------------------------------------------------------------------------------------- the estimators


def synthetic(K: int, seed: int, mu, delta, noise: float, inner_alpha: float, best: float):
    """K rollouts whose expectations are known: E g_exact = mu, E d = delta; one inner step with
    E c = (1 − best)·E a + best·E b, so the α minimising its credit error is ``best``."""
    g = torch.Generator().manual_seed(seed)
    P = mu.numel()
    ea, eb = torch.randn(P, generator=g, dtype=F64), torch.randn(P, generator=g, dtype=F64)
    out = []
    for _ in range(K):
        n = lambda: noise * torch.randn(P, generator=g, dtype=F64)  # noqa: E731
        exact = mu + n()
        a, b = ea + n(), eb + n()
        c = (1 - best) * ea + best * eb + n()
        out.append(
            RolloutGradients(
                exact, exact + delta + 0.3 * n(), [InnerStep(0, 1, 0.9, inner_alpha, inner_alpha, c, a, b)]
            )
        )
    return out


def test_the_unbiased_figures_find_a_known_bias_the_means_figures_misstate():
    P = 200
    g = torch.Generator().manual_seed(1)
    mu = torch.randn(P, generator=g, dtype=F64)
    mu /= mu.norm()
    delta = torch.randn(P, generator=g, dtype=F64)
    delta = 0.3 * delta / delta.norm() - 0.1 * mu  # ‖δ‖ ≈ 0.32‖μ‖, along μ: −0.1
    acc = BiasAccumulator()
    for r in synthetic(K=160, seed=2, mu=mu, delta=delta, noise=0.2, inner_alpha=0.5, best=0.8):
        acc.add(r)
    s = acc.summary()
    true_rel = float(delta.norm())
    true_cos = float((mu + delta) @ mu / ((mu + delta).norm() * mu.norm()))
    # per-rollout noise ‖n‖ = 0.2·√200 ≈ 2.8 × ‖μ‖: a mean of 160 still carries ~0.22‖μ‖ of it
    assert abs(s["rel_bias_u"] - true_rel) <= 4 * s["rel_bias_u_se"]
    assert abs(s["cos_expected_u"] - true_cos) <= 4 * s["cos_expected_u_se"]
    assert abs(s["bias_along_u"] - (-0.1)) <= 4 * s["bias_along_u_se"]
    assert s["rel_bias_u_se"] < 0.1 and s["cos_expected_u_se"] < 0.05  # resolved at this K
    assert s["noise_floor"]["cos"] < 0.95  # the halves' means differ: the means' figures carry noise
    (step,) = s["inner_steps"]
    assert abs(step["alpha_best_u"] - 0.8) <= 4 * step["alpha_best_u_se"]
    # credit error at α = 0.5 where the best is 0.8: ‖0.3·(E b − E a)‖ / ‖μ‖
    assert step["credit_error_u"] > step["credit_error_best_u"]


def test_the_estimator_table_finds_a_known_coupling_bias_and_noise():
    """One inner step (α = 0.5) whose far credit b carries a coupling x̄ = E(b − b_rep) and whose exact credit is
    c = a + 0.5·(b_rep − a) on average: JAGG at alpha_scale c' deviates by E d = c'·α·(E b − E a) − (E c − E a),
    the replica estimator by that minus c'·α·x̄; the noise of g_c' is the sum of its parts' variances."""
    P, K, noise, alpha = 200, 400, 0.05, 0.5
    g = torch.Generator().manual_seed(4)
    mu, ea, xbar = (torch.randn(P, generator=g, dtype=F64) for _ in range(3))
    mu, xbar = mu / mu.norm(), 0.4 * xbar / xbar.norm()
    eb_rep = ea + 0.6 * torch.randn(P, generator=g, dtype=F64) / math.sqrt(P)
    eb, ec = eb_rep + xbar, ea + 0.5 * (eb_rep - ea)
    acc = BiasAccumulator()
    for _ in range(K):
        n = lambda: noise * torch.randn(P, generator=g, dtype=F64)  # noqa: E731
        exact, a, b, c = mu + n(), ea + n(), eb + n(), ec + n()
        step = InnerStep(0, 1, 0.9, alpha, alpha, c, a, b, b_rep=eb_rep + n())
        acc.add(RolloutGradients(exact, exact + alpha * (b - a) - (c - a), [step]))
    rows = {row["alpha_scale"]: row for row in acc.summary()["estimators"]}
    assert set(rows) == {0.0, 0.25, 0.5, 0.75, 1.0}
    for scale, row in rows.items():
        d = scale * alpha * (eb - ea) - (ec - ea)
        assert abs(row["rel_bias_u"] - float(d.norm())) <= 4 * row["rel_bias_u_se"] + 1e-3
        assert abs(row["bias_along_u"] - float(d @ mu)) <= 4 * row["bias_along_u_se"] + 1e-3
        assert abs(row["coupling_u"] - scale * alpha * float(xbar.norm())) <= 4 * row["coupling_u_se"] + 1e-3
        rep = d - scale * alpha * xbar
        assert abs(row["rel_bias_replica_u"] - float(rep.norm())) <= 4 * row["rel_bias_replica_u_se"] + 1e-3
        var = noise**2 * P * (1 + (scale * alpha) ** 2 + (1 - scale * alpha) ** 2 + 1)
        assert row["noise_u"] == pytest.approx(var, rel=0.15)
        # the shares: ‖E d‖² and ‖E x‖² over one rollout's mean ‖g_exact‖² (= ‖μ‖² + noise² P = 1.5 here)
        gg = 1.0 + noise**2 * P
        assert abs(row["bias_share_u"] - float(d @ d) / gg) <= 4 * row["bias_share_u_se"] + 1e-3
        xs = (scale * alpha) ** 2 * float(xbar @ xbar) / gg
        assert abs(row["coupling_share_u"] - xs) <= 4 * row["coupling_share_u_se"] + 1e-3
    assert rows[1.0]["coupling_u_se"] < 0.1 * rows[1.0]["coupling_u"]  # resolved at this K
    (step_row,) = acc.summary()["inner_steps"]
    # the far credit at the replica, b_rep: E c = a + 0.5·(b_rep − a), so its best α is 0.5
    assert abs(step_row["alpha_best_replica_u"] - 0.5) <= 4 * step_row["alpha_best_replica_u_se"] + 1e-2


def test_no_bias_reads_as_none_within_its_standard_error():
    P = 200
    mu = torch.ones(P, dtype=F64) / math.sqrt(P)
    acc = BiasAccumulator()
    for r in synthetic(
        K=64, seed=3, mu=mu, delta=torch.zeros(P, dtype=F64), noise=0.2, inner_alpha=0.3, best=0.3
    ):
        acc.add(r)
    s = acc.summary()
    assert s["rel_bias_u"] <= 3 * s["rel_bias_u_se"] + 0.05
    assert s["rel_bias"] > 2 * s["rel_bias_u"] or s["rel_bias"] > 0.1  # the means' figure is the noise's size
    assert abs(s["bias_along_u"]) <= 4 * s["bias_along_u_se"]


def test_fewer_than_two_rollouts_is_refused():
    acc = BiasAccumulator()
    with pytest.raises(ValueError, match="^rollouts: the bias needs at least 2 rollouts"):
        acc.summary()


# ---------------------------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bias-runs")
    cfg = load_config(None, [*SMALL, "eval_every=0"])
    store = open_store(root)
    run_id = store.create_run(cfg.name, cfg.to_dict(), root / "run-0001")
    assert Trainer(cfg, run_id, str(root)).run() == "finished"
    ends = load_config(None, [*SMALL, "eval_every=0", "strategy=endpoint", "steps=1"])
    store.create_run("endpoint", ends.to_dict(), root / "run-0002")
    exact = load_config(None, [*SMALL, "eval_every=0", "strategy=exact", "steps=1"])
    run_id = store.create_run("exact", exact.to_dict(), root / "run-0003")
    assert Trainer(exact, run_id, str(root)).run() == "finished"
    return root


def _not_json(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_study_bias_measures_jagg_at_an_exact_runs_states(shapes_run: Path, tmp_path: Path, capsys) -> None:
    """An exact run's checkpoint: JAGG's bias over the same window at the states the exact backward reached."""
    code, text, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(shapes_run), "--run", "3", "--rollouts", "2", "--json",
        "--out", str(tmp_path / "bias"),
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(text, parse_constant=_not_json)
    assert result["subject"] == "run 3 step 1" and result["window"] == 4
    assert [s["step"] for s in result["inner_steps"]] == [1, 2] and result["rel_bias"] > 0


def test_study_bias_json_on_a_tiny_shapes_run(shapes_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bias"
    code, text, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(shapes_run), "--run", "1", "--step", "2", "--rollouts", "3",
        "--json", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(text, parse_constant=_not_json)  # one strict JSON object on stdout
    for key in ("cos_expected", "rel_bias", "noise_floor", "inner_steps", "cos_expected_u", "rel_bias_u"):
        assert key in result
    assert result["cos_expected_u_se"] is None  # 3 rollouts give no jackknife SE: null, never NaN
    assert result["subject"] == "run 1 step 2" and result["rollouts"] == 3 and result["batch"] == 8
    assert result["trained_steps"] == [0, 4] and result["streams"] == [3, 5]
    assert [s["step"] for s in result["inner_steps"]] == [1, 2]
    for s in result["inner_steps"]:
        assert 0 < s["alpha"] < 1 and s["credit_error"] >= 0 and math.isfinite(s["alpha_best"])
    assert -1 <= result["cos_expected"] <= 1 and result["rel_bias"] > 0
    assert set(result["noise_floor"]) == {"cos", "rel"}
    saved = json.loads((out / "bias-run1-step2.json").read_text(), parse_constant=_not_json)
    assert saved["rel_bias"] == result["rel_bias"]
    assert "| cos_expected |" in (out / "bias-run1-step2.md").read_text()
    # the base model (step 0) on the same streams is another model: other figures
    code, text0, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(shapes_run), "--run", "1", "--step", "0", "--rollouts", "3",
        "--json",
    )  # fmt: skip
    assert code == 0 and json.loads(text0)["rel_bias"] != result["rel_bias"]


def test_study_bias_replicas_and_eta(shapes_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bias"
    code, text, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(shapes_run), "--run", "1", "--step", "2", "--rollouts", "3",
        "--replicas", "--cross", "--eta", "0.3", "--json", "--out", str(out),
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(text, parse_constant=_not_json)
    assert result["eta"] == 0.3 and result["replicas"] is True and result["cross"] is True
    rows = result["estimators"]
    assert [r["alpha_scale"] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert rows[0]["coupling_u"] == 0.0  # c = 0 puts nothing at the far endpoint
    assert all("rel_bias_replica_u" in r and "noise_u" in r for r in rows)
    header = (
        "| c | rel_bias | bias_along | noise | bias share | coupling | coupling share | replica's rel_bias |"
    )
    assert (
        header + " cross's rel_bias | cross's bias_along | cross's bias share |"
        in (out / "bias-run1-step2.md").read_text()
    )
    assert all("rel_bias_cross_u" in r and "bias_share_cross_u" in r for r in rows)
    assert all("bias_share_u" in r and "coupling_share_u" in r for r in rows)
    code, text7, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(shapes_run), "--run", "1", "--step", "2", "--rollouts", "3",
        "--json",
    )  # fmt: skip
    assert (
        code == 0 and json.loads(text7)["eta"] == 0.7 and json.loads(text7)["rel_bias"] != result["rel_bias"]
    )


def test_the_replica_coupling_vanishes_where_the_jacobian_ignores_z() -> None:
    """v = A·z + θ_0 + t·θ_1 with A fixed: ∂v/∂θ does not depend on z, so the far credit at a replica of z_{W−1}
    is the far credit (x = b − b_rep = 0); with A trained it depends on z and the replica moves it."""
    from jagg_engine.backbones.linear_toy import LinearToy
    from jagg_engine.bias import rollout_gradients
    from jagg_engine.jagg import UpdateConfig
    from jagg_engine.sde import SamplerConfig, rollout

    for train_a, vanishes in ((False, True), (True, False)):
        model = LinearToy(train_a=train_a)
        sampler = SamplerConfig(num_steps=6, eta=0.7, sde_window=(0, 4))
        g = torch.Generator().manual_seed(0)
        traj = rollout(model, None, torch.randn(6, 16, generator=g, dtype=F64), sampler, generator=g)
        adv = torch.randn(6, generator=g, dtype=F64)
        params = model.trainable_parameters()
        r = rollout_gradients(model, params, traj, adv, UpdateConfig(window=4), sampler, replicas=g)
        assert len(r.inner) == 2
        for step in r.inner:
            gap = float((step.b - step.b_rep).norm() / step.b.norm())
            assert (gap <= 1e-12) if vanishes else (gap > 1e-3)


def test_the_estimator_table_finds_the_cross_fitted_bias():
    """One inner step (α = 0.5) whose cross-fitted far credit b_cross has its own mean: the cross estimator at
    alpha_scale c' deviates by c'·α·(E b_cross − E a) − (E c − E a), i.e. JAGG's deviation minus c'·α·E(b − b_cross)."""
    P, K, noise, alpha = 200, 400, 0.05, 0.5
    g = torch.Generator().manual_seed(5)
    mu, ea, eb, ecross = (torch.randn(P, generator=g, dtype=F64) for _ in range(4))
    mu = mu / mu.norm()
    ea, eb, ecross = (0.5 * v / v.norm() for v in (ea, eb, ecross))
    ec = ea + 0.5 * (ecross - ea) + 0.05 * torch.randn(P, generator=g, dtype=F64) / math.sqrt(P)
    acc = BiasAccumulator()
    for _ in range(K):
        n = lambda: noise * torch.randn(P, generator=g, dtype=F64)  # noqa: E731
        exact, a, b, c = mu + n(), ea + n(), eb + n(), ec + n()
        step = InnerStep(0, 1, 0.9, alpha, alpha, c, a, b, b_cross=ecross + n())
        acc.add(RolloutGradients(exact, exact + alpha * (b - a) - (c - a), [step]))
    rows = {row["alpha_scale"]: row for row in acc.summary()["estimators"]}
    for scale, row in rows.items():
        d = scale * alpha * (ecross - ea) - (ec - ea)
        assert abs(row["rel_bias_cross_u"] - float(d.norm())) <= 4 * row["rel_bias_cross_u_se"] + 1e-3
        assert abs(row["bias_along_cross_u"] - float(d @ mu)) <= 4 * row["bias_along_cross_u_se"] + 1e-3
        gg = 1.0 + noise**2 * P
        assert abs(row["bias_share_cross_u"] - float(d @ d) / gg) <= 4 * row["bias_share_cross_u_se"] + 1e-3
    # at c' = 1 the cross credit is the exact one but for 0.05 of noise: its bias is small, JAGG's is not
    assert rows[1.0]["rel_bias_cross_u"] < 0.2 < rows[1.0]["rel_bias_u"]


def test_the_cross_credit_is_the_engine_s_far_credit() -> None:
    """b_cross of every inner step is what far_credit=cross puts at the far endpoint: JAGG's gradient rebuilt
    from the pieces with b_cross in place of b is the engine's cross-fitted gradient (policy_update)."""
    from test_jagg import flat_grad, zero

    from jagg_engine.backbones.linear_toy import LinearToy
    from jagg_engine.bias import rollout_gradients
    from jagg_engine.jagg import UpdateConfig, policy_update
    from jagg_engine.sde import SamplerConfig, rollout

    model = LinearToy(train_a=True)
    sampler = SamplerConfig(num_steps=6, eta=0.7, sde_window=(0, 4))
    g = torch.Generator().manual_seed(0)
    traj = rollout(model, None, torch.randn(6, 16, generator=g, dtype=F64), sampler, generator=g)
    adv = torch.randn(6, generator=g, dtype=F64)
    params = model.trainable_parameters()
    r = rollout_gradients(model, params, traj, adv, UpdateConfig(window=4), sampler, cross_group=3)
    rebuilt = r.jagg + sum(s.alpha * (s.b_cross - s.b) for s in r.inner)
    zero(params)
    policy_update(model, traj, adv, UpdateConfig(window=4, far_credit="cross", group_size=3), sampler)
    engine = flat_grad(params)
    assert float((rebuilt - engine).norm() / engine.norm()) <= 1e-10
    assert float((r.jagg - engine).norm() / engine.norm()) > 1e-3
    with pytest.raises(ValueError, match="^micro_batch: the cross-fitted credit needs whole groups of 4"):
        rollout_gradients(
            model, params, traj, adv, UpdateConfig(window=4, micro_batch=4), sampler, cross_group=4
        )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--run", "1", "--eta", "0"], "--eta: must be in (0, 10]"),
        (["--run", "1", "--rollouts", "1"], "--rollouts: must be an integer >= 2"),
        (["--run", "2"], "--run: run 2 trains strategy endpoint with W = 4; the bias is JAGG's"),
        (["--run", "1", "--step", "7"], "--step: run 1 has no checkpoint at step 7; its checkpoints: 1, 2"),
        (["--run", "9"], "RUN: no run 9 in"),
    ],
)
def test_study_bias_refusals_are_one_line(shapes_run, tmp_path, capsys, argv, line):
    out = tmp_path / "bias"
    code, _, err = jagg(capsys, "study", "bias", "--runs-dir", str(shapes_run), "--out", str(out), *argv)
    assert (
        code == 2
        and err.strip().startswith(f"jagg study: error: {line}")
        and len(err.strip().splitlines()) == 1
    )
    assert not out.exists()


def test_study_bias_on_a_tiny_flux_checkpoint(tmp_path: Path, capsys) -> None:
    """A diffusers FLUX pipeline built from a small config, trained one step with LoRA and the control variate,
    measured at its step."""
    base = tmp_path / "flux"
    save_tiny_flux(str(base))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\ntwo blue dogs\n")
    cfg = load_config(
        None,
        [
            "backbone=flux", f"model_path={base}", f"prompts_file={prompts}",
            "backbone_options={resolution: 8, max_sequence_length: 6}", "lora_rank=4", "steps=1",
            "prompts_per_step=2", "group_size=2", "sampling_steps=6", "sde_window_end=4", "window=4",
            "eval_every=0", "sample_every=0", "rewards={brightness: 1.0}", "eval_num_prompts=2",
            "checkpoint_every=1", "cv_frac=0.5",  # the LoRA run trains with the control variate
        ],
        check_environment=False,
    )  # fmt: skip
    runs = tmp_path / "runs"
    run_id = open_store(runs).create_run(cfg.name, cfg.to_dict(), runs / "run-0001")
    assert Trainer(cfg, run_id, str(runs)).run() == "finished"
    frame = open_store(runs).metrics_frame(run_id)
    assert frame.loc[frame.step == 1, "count/cv_pairs"].item() == 2 * 2  # m = ceil(0.5 · 4) at 2 inner steps
    code, text, _ = jagg(
        capsys, "study", "bias", "--runs-dir", str(runs), "--run", str(run_id), "--step", "1", "--rollouts", "2",
        "--json",
    )  # fmt: skip
    assert code == 0, text
    result = json.loads(text)
    assert result["backbone"] == "flux" and result["trained_steps"] == [0, 4]
    assert (
        len(result["inner_steps"]) == 2 and result["rel_bias"] > 0 and math.isfinite(result["cos_expected"])
    )


def test_live_bias_follows_a_known_bias_through_noise():
    from jagg_engine.bias import LiveBias

    P = 200
    g = torch.Generator().manual_seed(7)
    mu = torch.randn(P, generator=g, dtype=F64)
    mu /= mu.norm()
    delta = 0.4 * torch.randn(P, generator=g, dtype=F64) / math.sqrt(P) - 0.2 * mu  # along μ: −0.2
    live = LiveBias(halflife=200)
    first = live.update(mu, mu + delta)
    assert math.isnan(first["bias/rel_live"]) and math.isnan(first["bias/along_live"])  # one probe: no pair
    for _ in range(3000):
        exact = mu + 0.1 * torch.randn(P, generator=g, dtype=F64)  # each probe ~1.4 × ‖μ‖ of noise
        out = live.update(exact, exact + delta + 0.05 * torch.randn(P, generator=g, dtype=F64))
    assert out["bias/rel_live"] == pytest.approx(float(delta.norm()), abs=0.05)
    assert out["bias/along_live"] == pytest.approx(-0.2, abs=0.05)


def test_a_probed_run_logs_the_live_bias(tmp_path):
    """probe_every = 1: each probe's whole-update gradients feed the run's LiveBias (its one group's cosine is
    the probe row's), the history holds what LiveBias gave at each step (NaN at the first, with no pair); a
    run without probes logs neither figure."""
    from jagg_engine.bias import LiveBias

    cfg = load_config(None, [*SMALL, "eval_every=0", "probe_every=1", "checkpoint_every=0", "steps=3"])
    store = open_store(tmp_path)
    run_id = store.create_run(cfg.name, cfg.to_dict(), tmp_path / "run-0001")
    trainer = Trainer(cfg, run_id, str(tmp_path))
    seen = []
    update = trainer.live_bias.update
    trainer.live_bias.update = lambda exact, jagg: (
        seen.append((exact.clone(), jagg.clone())),
        update(exact, jagg),
    )[1]
    assert trainer.run() == "finished"
    frame = store.metrics_frame(run_id).set_index("step")
    probes = {p["step"]: p for p in store.probes(run_id)}
    reference = LiveBias()
    assert len(seen) == 3
    for step, (exact, approx) in enumerate(seen, start=1):
        cos = float(exact.double() @ approx.double() / (exact.double().norm() * approx.double().norm()))
        assert cos == pytest.approx(probes[step]["cosine"], abs=1e-6)
        want = reference.update(exact, approx)
        for key, value in want.items():
            got = frame.loc[step, key]
            assert (math.isnan(value) and math.isnan(got)) or got == pytest.approx(value), (step, key)
    assert math.isnan(frame.loc[1, "bias/rel_live"])
    quiet = load_config(None, [*SMALL, "eval_every=0", "steps=1", "checkpoint_every=0"])
    run_id = store.create_run("quiet", quiet.to_dict(), tmp_path / "run-0002")
    assert Trainer(quiet, run_id, str(tmp_path)).run() == "finished"
    assert "bias/rel_live" not in store.metrics_frame(run_id)
