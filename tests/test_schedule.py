"""schedule: pipeline — the sampler's σ are the diffusers pipeline's own: the σ its scheduler holds after the
pipeline itself ran (``pipe(...)``, output_type "latent"), for a tiny FLUX pipeline with FLUX.1's dynamic shift
at two image sizes and a tiny SD3 pipeline with SD3's static shift."""

from __future__ import annotations

import pytest
import torch
from test_backbones_diffusers import SD3_OPTIONS, save_tiny_flux, save_tiny_sd3  # noqa: I001

from jagg_engine.train.config import ConfigError, load_config
from jagg_engine.train.trainer import build_model, pipeline_schedule, sampler_config

# FLUX.1-dev's scheduler_config.json: dynamic shift from the image sequence length
FLUX1_SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=4096,
    max_shift=1.15,
    shift=3.0,
    use_dynamic_shifting=True,
)


@pytest.fixture(scope="module")
def flux1_dir(tmp_path_factory):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    folder = tmp_path_factory.mktemp("tiny-flux1")
    save_tiny_flux(str(folder))
    pipe = FluxPipeline.from_pretrained(str(folder))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(**FLUX1_SCHEDULER)
    pipe.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sd3")
    save_tiny_sd3(str(folder))
    return str(folder)


def config(backbone, folder, steps, **options):
    return load_config(
        None,
        [
            f"backbone={backbone}",
            f"model_path={folder}",
            "prompts_file=prompts.txt",
            "rewards={brightness: 1.0}",
            f"sampling_steps={steps}",
            "sde_window_end=null",
            "window=2",
            "lora_rank=4",
            f"backbone_options={options}",
        ],
        check_environment=False,
    )


def sigmas_after_pipeline_call(pipe_cls, folder, steps, side, **kwargs):
    pipe = pipe_cls.from_pretrained(folder)
    pipe(
        prompt="a red cat",
        num_inference_steps=steps,
        height=side,
        width=side,
        output_type="latent",
        max_sequence_length=6,
        **kwargs,
    )
    return pipe.scheduler.sigmas.double()


@pytest.mark.parametrize("steps", [6, 10])
def test_flux_pipeline_sigmas_at_two_resolutions(flux1_dir, steps):
    from diffusers import FluxPipeline

    grids = {}
    for side in (8, 32):  # 4 and 64 packed tokens: different dynamic shifts
        cfg = config("flux", flux1_dir, steps, resolution=side, max_sequence_length=6)
        assert cfg.resolved_schedule() == "pipeline"  # the default for a diffusers backbone
        sampler = sampler_config(cfg, pipeline_schedule(cfg, build_model(cfg, torch.device("cpu"))))
        ours = sampler.sigmas()
        theirs = sigmas_after_pipeline_call(FluxPipeline, flux1_dir, steps, side)
        assert ours.shape == (steps + 1,)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
        grids[side] = ours
    assert (grids[8] - grids[32]).abs().max() > 1e-3  # the shift follows the image size


def test_sd3_pipeline_sigmas_static_shift(sd3_dir):
    from diffusers import StableDiffusion3Pipeline

    cfg = config("sd3", sd3_dir, 10, **{k: v for k, v in SD3_OPTIONS.items() if k != "lora_rank"})
    model = build_model(cfg, torch.device("cpu"))
    ours = sampler_config(cfg, pipeline_schedule(cfg, model)).sigmas()
    theirs = sigmas_after_pipeline_call(StableDiffusion3Pipeline, sd3_dir, 10, 8)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    # not the shifted-linear grid with the same shift: the scheduler's grid ends before σ = 0
    linear_cfg = cfg.apply_overrides(["schedule=shifted-linear", "shift=3.0"])
    linear = sampler_config(linear_cfg, pipeline_schedule(linear_cfg, model)).sigmas()
    assert (ours - linear).abs().max() > 1e-3


def test_shifted_linear_is_the_default_elsewhere_and_pipeline_is_refused_there():
    cfg = load_config(None, [], check_environment=False)
    assert cfg.resolved_schedule() == "shifted-linear" and cfg.sampler_config().schedule is None
    with pytest.raises(ConfigError, match=r"^schedule: backbone 'tiny-shapes' has no diffusers pipeline"):
        load_config(None, ["schedule=pipeline"], check_environment=False)
    with pytest.raises(
        ConfigError, match=r"^schedule: must be one of pipeline, shifted-linear, got 'karras'"
    ):
        load_config(None, ["schedule=karras"], check_environment=False)


def test_pipeline_schedule_refuses_a_shift(sd3_dir):
    with pytest.raises(ConfigError, match=r"^shift: the pipeline schedule takes its shift"):
        load_config(
            None,
            ["backbone=sd3", "prompts_file=p.txt", "rewards={brightness: 1.0}", "shift=3.0"],
            check_environment=False,
        )


def test_ode_sample_and_rollout_follow_an_explicit_schedule():
    """The eval's ODE sampler and the rollout step on the given grid (Euler by hand on the linear toy)."""
    from jagg_engine.backbones.linear_toy import LinearToy
    from jagg_engine.sde import SamplerConfig, ode_sample, rollout

    model = LinearToy()
    grid = (1.0, 0.9, 0.6, 0.2, 0.0)
    noise = torch.randn(
        3, *model.latent_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    z = noise.clone()
    for a, b in zip(grid[:-1], grid[1:]):
        z = z + (b - a) * model(z, torch.full((3,), a, dtype=torch.float64))
    torch.testing.assert_close(ode_sample(model, None, noise, 4, schedule=grid), z)
    traj = rollout(model, None, noise, SamplerConfig(num_steps=4, sde_window=(0, 1), schedule=grid))
    assert traj.sigmas.tolist() == list(grid)
    with pytest.raises(ValueError, match="^schedule: must hold num_steps"):
        SamplerConfig(num_steps=3, schedule=grid).sigmas()
