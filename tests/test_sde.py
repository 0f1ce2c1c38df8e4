import math

import pytest
import torch

from jagg_engine.backbones.linear_toy import LinearToy
from jagg_engine.sde import (
    SamplerConfig,
    cps_step,
    dance_step,
    flow_grpo_step,
    make_sigmas,
    ode_step,
    rollout,
    shift_sigmas,
)

# One scalar step, worked out by hand: σ = 0.8 → σ_next = 0.6, η = 0.7, z = 1, v̂ = 1, stored z' = 0.5.
Z, V, S, SN, ETA, X = 1.0, 1.0, 0.8, 0.6, 0.7, 0.5
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _t(x):
    return torch.tensor([[x]], dtype=torch.float64)  # (B=1, D=1)


def _logp(x, mean, std):
    return -((x - mean) ** 2) / (2 * std**2) - math.log(std) - HALF_LOG_2PI


def test_flow_grpo_step_by_hand():
    # std_t = η·sqrt(σ/(1−σ)) = 0.7·2 = 1.4; dt = −0.2
    # μ = z(1 + 1.96/(1.6)·(−0.2)) + v(1 + 1.96·0.2/1.6)(−0.2) = 0.755 − 0.249 = 0.506
    # std = 1.4·sqrt(0.2)
    out = flow_grpo_step(_t(V), _t(Z), S, SN, ETA, prev_sample=_t(X))
    std = 1.4 * math.sqrt(0.2)
    assert out.mean.item() == pytest.approx(0.506, abs=1e-12)
    assert out.std.item() == pytest.approx(std, abs=1e-12)
    assert out.log_prob.item() == pytest.approx(_logp(X, 0.506, std), abs=1e-12)


def test_dance_step_by_hand():
    # Δσ = 0.2; x̂0 = 1 − 0.8 = 0.2; score = −(1 − 0.2·0.2)/0.64 = −1.5
    # μ = 1 − 0.2 + 0.5·0.49·(−1.5)·0.2 = 0.8 − 0.0735 = 0.7265; std = 0.7·sqrt(0.2)
    out = dance_step(_t(V), _t(Z), S, SN, ETA, prev_sample=_t(X))
    std = 0.7 * math.sqrt(0.2)
    assert out.mean.item() == pytest.approx(0.7265, abs=1e-12)
    assert out.log_prob.item() == pytest.approx(_logp(X, 0.7265, std), abs=1e-12)


@pytest.mark.parametrize("form", ["flow-grpo", "gaussian"])
def test_cps_step_by_hand(form):
    # std = 0.6·sin(0.35π); x̂0 = 0.2; ε̂ = 1 + 0.2·1 = 1.2; μ = 0.4·0.2 + sqrt(0.36 − std²)·1.2
    std = 0.6 * math.sin(0.35 * math.pi)
    mean = 0.4 * 0.2 + math.sqrt(0.36 - std**2) * 1.2
    # Flow-GRPO's CPS log-prob drops the constants and the 1/(2·std²) factor: −(z' − μ)²
    expected = -((X - mean) ** 2) if form == "flow-grpo" else _logp(X, mean, std)
    out = cps_step(_t(V), _t(Z), S, SN, ETA, prev_sample=_t(X), log_prob_form=form)
    assert out.mean.item() == pytest.approx(mean, abs=1e-12)
    assert out.std.item() == pytest.approx(std, abs=1e-12)
    assert out.log_prob.item() == pytest.approx(expected, abs=1e-12)
    sampler = SamplerConfig(kind="cps", num_steps=5, cps_log_prob=form)  # σ = 1, .8, .6, …: step 1 is S → SN
    via_sampler = sampler.step(_t(V), _t(Z), 1, sampler.sigmas(), prev_sample=_t(X))
    assert via_sampler.log_prob.item() == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="σ_next = 0"):
        cps_step(_t(V), _t(Z), 0.1, 0.0, ETA)


def test_cps_default_is_flow_grpo_form_and_averages_over_dims():
    g = torch.Generator().manual_seed(0)
    v, z, x = (torch.randn(3, 2, 5, generator=g, dtype=torch.float64) for _ in range(3))
    std = SN * math.sin(ETA * math.pi / 2)
    mean = (1 - SN) * (z - S * v) + math.sqrt(SN**2 - std**2) * (z + (1 - S) * v)
    out = cps_step(v, z, S, SN, ETA, prev_sample=x)  # the default form
    torch.testing.assert_close(out.log_prob, (-((x - mean) ** 2)).mean(dim=(1, 2)))
    gaussian = cps_step(v, z, S, SN, ETA, prev_sample=x, log_prob_form="gaussian")
    per_elem = -((x - mean) ** 2) / (2 * std**2) - math.log(std) - HALF_LOG_2PI
    torch.testing.assert_close(gaussian.log_prob, per_elem.mean(dim=(1, 2)))
    # the PPO log-ratio of the flow-grpo form is 2·std² times the Gaussian one (the constants cancel)
    other = cps_step(v + 0.1, z, S, SN, ETA, prev_sample=x)
    other_g = cps_step(v + 0.1, z, S, SN, ETA, prev_sample=x, log_prob_form="gaussian")
    torch.testing.assert_close(
        other.log_prob - out.log_prob, 2 * std**2 * (other_g.log_prob - gaussian.log_prob)
    )
    with pytest.raises(ValueError, match="^cps_log_prob: must be one of flow-grpo, gaussian"):
        SamplerConfig(kind="cps", cps_log_prob="full")


def test_log_prob_is_mean_over_non_batch_dims():
    g = torch.Generator().manual_seed(0)
    v, z, x = (torch.randn(3, 2, 5, generator=g, dtype=torch.float64) for _ in range(3))
    out = dance_step(v, z, S, SN, ETA, prev_sample=x)
    per_elem = -((x - out.mean) ** 2) / (2 * out.std**2) - torch.log(out.std) - HALF_LOG_2PI
    torch.testing.assert_close(out.log_prob, per_elem.mean(dim=(1, 2)))
    assert out.log_prob.shape == (3,)


def test_flow_grpo_sigma_one_uses_sigma_max():
    z, v = torch.ones(1, 1), torch.ones(1, 1)
    out = flow_grpo_step(v, z, 1.0, 0.9, ETA, sigma_max=0.9, prev_sample=z)
    assert torch.isfinite(out.log_prob).all()
    # std_t = η·sqrt(1/(1 − 0.9)) = 0.7·sqrt(10); std = std_t·sqrt(−dt) = 0.7·sqrt(10)·sqrt(0.1) = 0.7
    assert out.std.item() == pytest.approx(0.7 * math.sqrt(10) * math.sqrt(0.1), rel=1e-6)


def test_step_math_runs_in_float32_for_bf16_models():
    v = torch.randn(2, 4).to(torch.bfloat16)
    out = flow_grpo_step(v, v, 0.5, 0.4, ETA)
    assert out.log_prob.dtype == torch.float32 and out.prev_sample.dtype == torch.float32


def test_schedules():
    s = make_sigmas(4)
    torch.testing.assert_close(s, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64))
    assert shift_sigmas(torch.tensor(0.5), 3.0).item() == pytest.approx(0.75)  # 1.5 / 2
    shifted = make_sigmas(4, shift=3.0)
    assert (
        shifted[0] == 1
        and shifted[-1] == 0
        and (shifted.diff() < 0).all()
        and (shifted[1:-1] > s[1:-1]).all()
    )
    with pytest.raises(ValueError, match="num_steps"):
        make_sigmas(0)


@pytest.mark.parametrize("kind", ["flow-grpo", "dance", "cps"])
def test_rollout_old_log_probs_recomputed_exactly(kind):
    model = LinearToy()
    sampler = SamplerConfig(kind=kind, num_steps=6, shift=3.0)
    g = torch.Generator().manual_seed(1)
    traj = rollout(model, None, torch.randn(3, 16, generator=g, dtype=torch.float64), sampler, generator=g)
    assert traj.latents.shape == (7, 3, 16) and traj.log_probs.shape == (6, 3)
    for j in traj.sde_steps:
        v = model(traj.latents[j], traj.sigmas[j].expand(3), None)
        out = sampler.step(v, traj.latents[j], j, traj.sigmas, prev_sample=traj.latents[j + 1])
        torch.testing.assert_close(out.log_prob, traj.log_probs[j], rtol=0, atol=1e-12)
    expected = list(range(5)) if kind == "cps" else list(range(6))  # CPS cannot sample σ_next = 0
    assert traj.sde_steps == expected


def test_sde_window_steps_outside_are_ode():
    model = LinearToy()
    sampler = SamplerConfig(num_steps=8, sde_window=(2, 5))
    g = torch.Generator().manual_seed(2)
    traj = rollout(model, None, torch.randn(2, 16, generator=g, dtype=torch.float64), sampler, generator=g)
    assert traj.sde_steps == [2, 3, 4]
    for j in (0, 1, 5, 6, 7):
        assert (traj.log_probs[j] == 0).all()
        v = model(traj.latents[j], traj.sigmas[j].expand(2), None)
        torch.testing.assert_close(
            traj.latents[j + 1], ode_step(v, traj.latents[j], traj.sigmas[j], traj.sigmas[j + 1])
        )


def test_sampler_config_errors_name_the_field():
    with pytest.raises(ValueError, match="^algorithm: must be one of flow-grpo, dance, cps"):
        SamplerConfig(kind="ddim")
    with pytest.raises(ValueError, match="^sde_window"):
        SamplerConfig(num_steps=4, sde_window=(2, 9))
    with pytest.raises(ValueError, match="^steps"):
        SamplerConfig(num_steps=0)
